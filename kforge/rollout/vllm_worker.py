"""The vLLM backend: the engine lives in its own process on its own GPU set; requests travel over a Pipe.

Why a process: vLLM must see only the rollout GPUs (CUDA_VISIBLE_DEVICES has to be set before torch or
vLLM initialise CUDA in that process), its import and CUDA state must not leak into the trainer, and a
crash there must not take the run down with it. The child is started with `spawn` and the variables are
put in the environment the child is executed with, so nothing imported before our code runs (the
parent's main module is re-imported by spawn) can initialise CUDA on the wrong devices.

Weight sync: every `load_adapter` registers the PEFT folder under a new integer LoRA id (never reused:
vLLM caches adapters and prefixes by id) and resets the prefix cache, so no cached KV computed with older
weights is reused. Log-probs are vLLM's `processed_logprobs` (see `kforge.rollout.base`).

`VLLMEngine` is the only code that touches vLLM; the serving loop `_serve` speaks to any object with its
methods, which is how the process and pipe protocol are tested on machines without a GPU.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.util
import multiprocessing as mp
import os
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from kforge.rollout.base import BackendError, Completion, GenerationRequest, OnCompletion, run_in_thread

DEFAULT_ENGINE = "kforge.rollout.vllm_worker:VLLMEngine"
LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_ENV_LOCK = threading.Lock()


# ---------------------------------------------------------------------------------------------- child side
class VLLMEngine:
    """Thin wrapper over `vllm.LLM`, constructed inside the worker process."""

    def __init__(self, **engine_kwargs: Any) -> None:
        from vllm import LLM

        self.llm = LLM(**engine_kwargs)

    def generate(self, requests: list[dict[str, Any]], lora: tuple[str, int, str] | None) -> list[dict[str, Any]]:
        from vllm import SamplingParams as VSamplingParams

        prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in requests]
        params = []
        for r in requests:
            s = r["sampling"]
            kwargs: dict[str, Any] = dict(
                n=1,
                max_tokens=s["max_tokens"],
                temperature=s["temperature"],
                top_p=s["top_p"],
                seed=s["seed"],
                logprobs=0,  # the sampled token's log-prob only
                include_stop_str_in_output=True,  # text stays the decode of token_ids
                skip_special_tokens=True,
            )
            if s["top_k"] and s["top_k"] > 0:  # "off" is spelled differently across vLLM versions: omit it
                kwargs["top_k"] = s["top_k"]
            if s["stop"]:
                kwargs["stop"] = list(s["stop"])
            params.append(VSamplingParams(**kwargs))
        outs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=self._lora_request(lora))
        results = []
        for out in outs:
            o = out.outputs[0]
            token_ids = list(o.token_ids)
            results.append(
                {
                    "token_ids": token_ids,
                    "text": o.text,
                    "logprobs": sampled_logprobs_of(token_ids, o.logprobs),
                    "finish_reason": "length" if o.finish_reason == "length" else "stop",
                }
            )
        return results

    @staticmethod
    def _lora_request(lora: tuple[str, int, str] | None) -> Any:
        if lora is None:
            return None
        from vllm.lora.request import LoRARequest

        name, int_id, path = lora
        return LoRARequest(name, int_id, path)

    def load_lora(self, lora: tuple[str, int, str]) -> None:
        """Load now (a one-token request), so that a bad adapter fails here and the LoRA kernels' first-use
        compilation is not billed to the next rollout."""
        from vllm import SamplingParams as VSamplingParams

        self.llm.generate(
            [{"prompt_token_ids": [0]}],
            VSamplingParams(max_tokens=1, temperature=0.0),
            use_tqdm=False,
            lora_request=self._lora_request(lora),
        )

    def remove_lora(self, int_id: int) -> None:
        engine = getattr(self.llm, "llm_engine", None)
        try:
            if engine is not None and hasattr(engine, "remove_lora"):
                engine.remove_lora(int_id)
        except Exception:  # already evicted from the engine's LRU: nothing to free
            pass

    def reset_prefix_cache(self) -> None:
        self.llm.reset_prefix_cache()

    def sleep(self, level: int = 1) -> None:
        self.llm.sleep(level=level)

    def wake(self) -> None:
        self.llm.wake_up()
        self.llm.reset_prefix_cache()  # the KV cache was discarded while asleep


def sampled_logprobs_of(token_ids: list[int], logprobs: Any) -> list[float]:
    """The sampled tokens' log-probs from a vLLM CompletionOutput.logprobs (a list with one {token id:
    Logprob} mapping per position; with logprobs=0 each holds just the sampled token)."""
    if logprobs is None:
        raise BackendError("vLLM returned no log-probs (SamplingParams.logprobs was not honoured)")
    out = []
    for i, token in enumerate(token_ids):
        entry = logprobs[i][token]
        out.append(float(getattr(entry, "logprob", entry)))
    return out


def _resolve(spec: str) -> Any:
    module, _, name = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def _serve(conn: Any, env: dict[str, str], log_path: str | None, engine_spec: str, engine_kwargs: dict[str, Any]) -> None:
    """The worker process: build the engine, then answer (op, kwargs) messages until 'close'."""
    os.environ.update(env)  # also set at spawn time; repeated for engines started another way
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    try:
        engine = _resolve(engine_spec)(**engine_kwargs)
    except BaseException:
        conn.send(("error", _short_traceback()))
        return
    conn.send(("ok", {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")}))
    while True:
        try:
            op, kwargs = conn.recv()
        except EOFError:  # the parent is gone
            return
        if op == "close":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", getattr(engine, op)(**kwargs)))
        except BaseException:
            conn.send(("error", _short_traceback()))


def _short_traceback(lines: int = 12) -> str:
    text = traceback.format_exc().strip().splitlines()
    return "\n".join(text[-lines:])


# --------------------------------------------------------------------------------------------- parent side
def visible_devices_for(devices: list[int] | None, parent_visible: str | None) -> str | None:
    """CUDA_VISIBLE_DEVICES for the child: `devices` index the GPUs the parent sees."""
    if devices is None:
        return parent_visible
    if parent_visible:
        physical = [d.strip() for d in parent_visible.split(",") if d.strip()]
        try:
            return ",".join(physical[i] for i in devices)
        except IndexError:
            raise BackendError(
                f"rollout GPUs {devices} are not all visible (CUDA_VISIBLE_DEVICES={parent_visible})"
            ) from None
    return ",".join(str(i) for i in devices)


def lora_rank_for(rank: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds `rank`."""
    try:
        from typing import get_args

        from vllm.config.lora import MaxLoRARanks  # type: ignore[import-not-found]

        ranks = sorted(get_args(MaxLoRARanks)) or list(LORA_RANKS)
    except Exception:
        ranks = list(LORA_RANKS)
    for r in ranks:
        if rank <= r:
            return r
    raise BackendError(f"lora.rank={rank} is above vLLM's largest max_lora_rank {ranks[-1]}")


def engine_kwargs_from_config(cfg: Any, devices: list[int] | None) -> dict[str, Any]:
    from kforge.modelio import resolve_model

    ref = resolve_model(cfg.model.name, cfg.model.gguf_file)
    model = str(Path(ref.path) / ref.gguf_file) if ref.gguf_file else ref.path
    kwargs: dict[str, Any] = dict(
        model=model,
        tokenizer=ref.path,
        dtype=cfg.model.dtype,
        max_model_len=cfg.model.max_model_len,
        gpu_memory_utilization=cfg.rollout.gpu_memory_utilization,
        enable_prefix_caching=cfg.rollout.enable_prefix_caching,
        enforce_eager=cfg.rollout.enforce_eager,
        enable_sleep_mode=cfg.rollout.sleep_between_phases,
        enable_lora=True,
        max_lora_rank=lora_rank_for(cfg.lora.rank),
        max_loras=1,
        tensor_parallel_size=max(1, len(devices)) if devices else 1,
        seed=cfg.dataset.seed,
        trust_remote_code=cfg.model.trust_remote_code,
        logprobs_mode="processed_logprobs",
    )
    return kwargs


def child_env(devices: list[int] | None) -> dict[str, str]:
    env = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",
    }
    visible = visible_devices_for(devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
    if visible is not None:
        env["CUDA_VISIBLE_DEVICES"] = visible
    if importlib.util.find_spec("flashinfer") is None and "VLLM_USE_FLASHINFER_SAMPLER" not in os.environ:
        env["VLLM_USE_FLASHINFER_SAMPLER"] = "0"  # vLLM's sampler otherwise imports FlashInfer
    return env


class VLLMBackend:
    """`RolloutBackend` over a vLLM engine in a worker process."""

    def __init__(
        self,
        tokenizer: Any,
        engine_kwargs: dict[str, Any],
        *,
        devices: list[int] | None = None,
        engine: str = DEFAULT_ENGINE,
        log_path: str | None = None,
        startup_timeout_s: float = 1200.0,
        env: dict[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.version = 0
        self.log_path = log_path
        self._lora: tuple[str, int, str] | None = None
        self._next_lora_id = 1
        self._lock = threading.Lock()  # one message in flight on the pipe
        self._closed = False
        self._asleep = False
        self._pending_adapter: tuple[str, int] | None = None
        child_vars = {**child_env(devices), **(env or {})}
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(
            target=_serve,
            args=(child_conn, child_vars, log_path, engine, engine_kwargs),
            name="kforge-rollout",
            daemon=False,  # vLLM starts processes of its own; a daemon may not
        )
        with _ENV_LOCK:  # the spawned interpreter inherits the environment at start()
            saved = {k: os.environ.get(k) for k in child_vars}
            os.environ.update(child_vars)
            try:
                self._proc.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        child_conn.close()
        atexit.register(self.close)
        try:
            self.info = self._receive(startup_timeout_s, "start")
        except BackendError:
            self.close()
            raise

    @classmethod
    def from_config(cls, cfg: Any, devices: list[int] | None = None, **kwargs: Any) -> "VLLMBackend":
        from kforge.modelio import load_tokenizer, resolve_model

        ref = resolve_model(cfg.model.name, cfg.model.gguf_file)
        tokenizer = load_tokenizer(ref, cfg.model.chat_template, cfg.model.trust_remote_code)
        engine_kwargs = engine_kwargs_from_config(cfg, devices)
        engine_kwargs.update(kwargs.pop("engine_kwargs", {}))
        return cls(tokenizer, engine_kwargs, devices=devices, **kwargs)

    # ------------------------------------------------------------------ pipe
    def _receive(self, timeout_s: float | None, what: str) -> Any:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        where = f"; see {self.log_path}" if self.log_path else ""
        while not self._conn.poll(1.0):
            if not self._proc.is_alive():
                raise BackendError(f"vLLM worker died during {what} (exit code {self._proc.exitcode}){where}")
            if deadline is not None and time.monotonic() > deadline:
                raise BackendError(f"vLLM worker did not answer {what} within {timeout_s:.0f} s")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError):  # the pipe closed: the worker is gone
            self._proc.join(timeout=10)
            raise BackendError(f"vLLM worker died during {what} (exit code {self._proc.exitcode}){where}") from None
        if status != "ok":
            last = payload.strip().splitlines()[-1] if payload.strip() else "unknown error"
            raise BackendError(f"vLLM worker failed in {what}: {last}\n{payload}")
        return payload

    def _call(self, op: str, timeout_s: float | None = None, **kwargs: Any) -> Any:
        if self._closed:
            raise BackendError(f"vLLM backend is closed ({op})")
        with self._lock:
            self._conn.send((op, kwargs))
            return self._receive(timeout_s, op)

    # ------------------------------------------------------------------ RolloutBackend
    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        if not requests:
            return []
        payload = [{"prompt_ids": list(r.prompt_ids), "sampling": r.sampling.__dict__.copy()} for r in requests]
        for p in payload:
            p["sampling"]["stop"] = list(p["sampling"]["stop"])
        outs = self._call("generate", requests=payload, lora=self._lora)
        return [Completion(**o) for o in outs]

    async def agenerate(
        self, requests: list[GenerationRequest], on_completion: OnCompletion | None = None
    ) -> list[Completion]:
        return await run_in_thread(self.generate, requests, on_completion)

    def load_adapter(self, path: str, version: int) -> None:
        """Register the adapter under a fresh id; while asleep the load waits for `wake()` (loading needs
        the engine's GPU memory)."""
        if not (Path(path) / "adapter_config.json").is_file():
            raise BackendError(f"vLLM backend: {path} is not a PEFT adapter folder (no adapter_config.json)")
        if self._asleep:
            self._pending_adapter = (path, version)
            self.version = version
            return
        lora = (f"kforge-v{version}-{self._next_lora_id}", self._next_lora_id, str(Path(path).resolve()))
        self._next_lora_id += 1  # never reused, even for a reload of the same version
        self._call("load_lora", lora=lora)
        previous, self._lora = self._lora, lora
        self.version = version
        self._call("reset_prefix_cache")  # cached KV of older weights must not be reused
        if previous is not None:
            self._call("remove_lora", int_id=previous[1])

    def sleep(self) -> None:
        if not self._asleep:
            self._call("sleep", level=1)  # level 2 with LoRA has crashed upstream; level 1 keeps weights in RAM
            self._asleep = True

    def wake(self) -> None:
        if self._asleep:
            self._call("wake")
            self._asleep = False
        if self._pending_adapter is not None:
            path, version = self._pending_adapter
            self._pending_adapter = None
            self.load_adapter(path, version)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._proc.is_alive():
                with self._lock:
                    self._conn.send(("close", {}))
                    if self._conn.poll(60):
                        self._conn.recv()
        except (OSError, EOFError, BrokenPipeError):
            pass
        self._proc.join(timeout=60)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
