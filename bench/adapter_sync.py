#!/usr/bin/env python3
"""Adapter sync on a busy engine: each part of the trainer's sync of a rank-32 LoRA on a 7B shape, timed.

    python -m bench.adapter_sync [--shape 7b|1.5b|tiny] [--rank 32] [--syncs 6] [--prompts 64] [--tokens 1024]

The parts, in the order `Trainer._sync_adapter` runs them:
  save    the adapter cast to the engine's dtype and written whole by `EngineCopies` (under /dev/shm when it is
          usable) through the learner's own writer (`ckpt.atomic_folder` + `lora.save_adapter_folder`);
  load    `VLLMBackend.load_adapter`: the worker's engine reads the folder and moves it to its GPU;
  remove  the replaced adapter unloaded (now, or by its last request in flight).
The learner's side runs in this process: Qwen2.5-Coder-7B's config with random bf16 weights on GPU 0 and a
LoRA attached by `lora.attach_lora` (fp32 master weights, as the learner keeps them). The engine is kforge's
VLLMBackend with the arguments `engine_kwargs_from_config` gives (vLLM's dummy weights: nothing is read).
A thread keeps `--prompts` requests decoding the whole time, so every timed sync lands on a generating engine,
as in a pipelined step; one sync on an idle engine is shown beside them. Target: a whole sync under 1 s.
Needs a GPU and vLLM (bench/device/prepare.sh).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import threading
import time
from pathlib import Path

# From the published config.json files (the same shapes as bench/learner.py's).
SHAPES = {
    "7b": dict(arch="qwen2", hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944),
    "1.5b": dict(arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960),
    "tiny": dict(arch="qwen2", hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1408),
}
TARGET_S = 1.0


class Load:
    """Keeps the engine generating: batch after batch of the same requests until stopped."""

    def __init__(self, backend, requests) -> None:
        self.backend, self.requests = backend, requests
        self.tokens, self.batches = 0, 0
        self._stop = threading.Event()
        self.started = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.started.set()
                outs = self.backend.generate(self.requests)
                self.tokens += sum(len(o.token_ids) for o in outs)
                self.batches += 1
        except BaseException as exc:  # shown by the caller: a sync that broke generation is a failure
            self.error = exc
            self.started.set()

    def __enter__(self) -> "Load":
        self._thread.start()
        self.started.wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.adapter_sync", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--syncs", type=int, default=6, help="timed syncs while generating")
    ap.add_argument("--gap", type=float, default=2.0, help="seconds of generation between two syncs")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1024, help="new tokens per request")
    ap.add_argument("--gpu-mem", type=float, default=0.45)
    ap.add_argument("--work", default=None)
    args = ap.parse_args()

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from bench.scratch_model import write_model_folder
    from kforge.config.schema import KforgeConfig
    from kforge.learner import checkpoint as ckpt
    from kforge.learner.lora import attach_lora, save_adapter_folder
    from kforge.modelio import ModelRef, load_tokenizer
    from kforge.rollout.adapters import EngineCopies
    from kforge.rollout.base import GenerationRequest, SamplingParams
    from kforge.rollout.vllm_worker import VLLMBackend, engine_kwargs_from_config

    work = Path(args.work or tempfile.mkdtemp(prefix="kforge-sync-"))
    folder = write_model_folder(work / "model", max_positions=8192, **SHAPES[args.shape])  # config + tokenizer
    tok = load_tokenizer(ModelRef(str(folder)))
    cfg = KforgeConfig()
    cfg.model.name, cfg.model.dtype, cfg.model.max_model_len = str(folder), "bfloat16", 4096
    cfg.lora.rank, cfg.lora.alpha = args.rank, 2 * args.rank
    cfg.rollout.gpu_memory_utilization = args.gpu_mem
    cfg.rollout.sleep_between_phases = False  # a pipelined step's engine never sleeps

    torch.manual_seed(0)
    t0 = time.time()
    with torch.device("cuda:0"):
        base = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=torch.bfloat16)
    model = attach_lora(base, cfg)
    adapter = "default"
    lora_params = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    print(f"{args.shape} shape: learner side built in {time.time() - t0:.0f} s; LoRA r{args.rank}: "
          f"{lora_params / 1e6:.1f} M parameters", flush=True)

    kwargs = {**engine_kwargs_from_config(cfg, [0], ModelRef(str(folder))), "load_format": "dummy"}
    t0 = time.time()
    backend = VLLMBackend(tok, kwargs, devices=[0], log_path=str(work / "vllm_worker.log"))
    print(f"engine ready in {time.time() - t0:.0f} s", flush=True)
    copies = EngineCopies(work / "adapters", shm=True, dtype=backend.adapter_dtype)
    print(f"engine copies in {copies.root} ({backend.adapter_dtype})", flush=True)

    def save(path: Path, dtype: str | None) -> None:  # Learner.save_adapter's body, the learner's writer
        with ckpt.atomic_folder(path) as tmp:
            save_adapter_folder(model, adapter, tmp, dtype)

    version = 0

    def sync() -> dict[str, float]:
        nonlocal version
        version += 1
        with torch.no_grad():  # a new adapter each time, as after an optimiser step
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.add_(torch.randn_like(p), alpha=1e-3)
        t0 = time.perf_counter()
        path = copies.write(version, save)
        t1 = time.perf_counter()
        backend.load_adapter(str(path), version)
        total = time.perf_counter() - t0
        copies.prune(keep=3)
        mb = sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) / 2**20
        return {"save": t1 - t0, "load": backend.load_times["sync_engine_load_s"],
                "remove": backend.load_times["sync_remove_s"], "total": total, "MiB": mb}

    requests = [GenerationRequest([int(x) for x in torch.randint(100, len(tok), (256,))],
                                  SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=i))
                for i in range(args.prompts)]
    rows: list[tuple[str, dict[str, float]]] = []
    try:
        rows.append(("idle (first)", sync()))  # vLLM's first load pays one-time set-up
        rows.append(("idle", sync()))
        with Load(backend, requests) as load:
            time.sleep(args.gap)
            for i in range(args.syncs):
                rows.append((f"generating {i + 1}", sync()))
                time.sleep(args.gap)
            busy_s = args.gap * (args.syncs + 1)
        if load.error is not None:
            raise RuntimeError(f"generation failed during the syncs: {load.error!r}")
    finally:
        backend.close()
        copies.close()

    print(f"\nGPU: {torch.cuda.get_device_name(0)}; {args.shape} shape, LoRA rank {args.rank} on every linear; "
          f"{args.prompts} requests x {args.tokens} tokens decoding during the 'generating' syncs "
          f"({load.tokens} tokens in {load.batches} whole batches)")
    print(f"{'sync':<16} | {'MiB':>6} | {'save s':>7} | {'load s':>7} | {'remove s':>8} | {'total s':>7}")
    for name, r in rows:
        print(f"{name:<16} | {r['MiB']:>6.1f} | {r['save']:>7.3f} | {r['load']:>7.3f} | {r['remove']:>8.3f} | {r['total']:>7.3f}")
    busy = [r["total"] for name, r in rows if name.startswith("generating")]
    median = statistics.median(busy)
    print(f"\nwhile generating: median {median:.3f} s, max {max(busy):.3f} s; target < {TARGET_S:g} s: "
          f"{'PASS' if max(busy) < TARGET_S else 'FAIL'}  (the load thread ran ~{busy_s:.0f} s)")
    return 0 if max(busy) < TARGET_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
