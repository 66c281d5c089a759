"""Which generation backend a config asks for, and building it: the only module that imports both.

Backends import `kforge.rollout.base`; this module imports the backends. Keeping the factory out of
`base` is what keeps the package free of an import circle.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any, Callable

from kforge.rollout.base import BackendError, RolloutBackend

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig


def vllm_available() -> bool:
    """vLLM is installed (found without importing it: its import takes ~30 s and belongs in the worker)."""
    return importlib.util.find_spec("vllm") is not None


def cuda_available() -> bool:
    from kforge.gpus import visible_ids

    return bool(visible_ids())


def choose_backend(requested: str) -> str:
    """'auto' -> 'vllm' when vLLM is installed and a GPU is present, else 'hf'."""
    if requested == "auto":
        return "vllm" if vllm_available() and cuda_available() else "hf"
    if requested == "vllm" and not vllm_available():
        raise BackendError("rollout.backend=vllm but vLLM is not installed: pip install 'kforge[gpu]', or set rollout.backend=hf")
    if requested == "vllm" and not cuda_available():
        raise BackendError("rollout.backend=vllm needs a CUDA GPU and none is visible; set rollout.backend=hf")
    if requested not in ("vllm", "hf"):
        raise BackendError(f"rollout.backend={requested!r} is not one of auto, vllm, hf")
    return requested


def make_backend(cfg: "KforgeConfig", devices: list[int] | None = None, tensor_parallel: int | None = None,
                 **kwargs: object) -> RolloutBackend:
    """The configured backend on `devices`: logical GPU indices as this process sees them (the vLLM worker
    maps them to physical ids through `kforge.gpus` for its own CUDA_VISIBLE_DEVICES). None: the hf backend
    takes GPU 0 when there is one, the vLLM worker the GPUs this process sees. With `tensor_parallel` GPUs
    per engine and more devices than that, one vLLM engine per group of devices behind a router
    (`kforge.rollout.replicas`). Extra keyword arguments go to the backend's constructor."""
    kind = choose_backend(cfg.rollout.backend)
    if kind == "vllm":
        from kforge.rollout.vllm_worker import VLLMBackend

        if devices and tensor_parallel and len(devices) > tensor_parallel:
            from kforge.modelio import resolve_model

            # Resolved once for all the engines: a GGUF source is converted once, not by each replica at once.
            ref = resolve_model(cfg.model.name, cfg.model.gguf_file)
            return _replicas(VLLMBackend.from_config, cfg, devices, tensor_parallel, {**kwargs, "ref": ref})
        return VLLMBackend.from_config(cfg, devices, **kwargs)
    from kforge.rollout.hf import HFBackend

    return HFBackend.from_config(cfg, devices, **kwargs)


def _replicas(start: Callable[..., RolloutBackend], cfg: "KforgeConfig", devices: list[int], tp: int,
              kwargs: dict[str, Any]) -> RolloutBackend:
    """One engine per `tp` devices, started at once (each takes minutes); a failed start closes the others.
    A replica that dies later is started again alone, on its own devices (`Replicas`)."""
    import concurrent.futures as cf

    from kforge.rollout.replicas import Replicas

    groups = [devices[i:i + tp] for i in range(0, len(devices), tp)]

    def one(k: int) -> RolloutBackend:
        log = kwargs.get("log_path")
        own = {**kwargs, "log_path": f"{log.removesuffix('.log')}.replica{k}.log"} if log and k else kwargs
        return start(cfg, groups[k], **own)

    with cf.ThreadPoolExecutor(max_workers=len(groups)) as pool:
        futures = [pool.submit(one, k) for k in range(len(groups))]
        cf.wait(futures)
    failed = [f.exception() for f in futures if f.exception() is not None]
    if failed:
        for f in futures:
            if f.exception() is None:
                f.result().close()
        raise failed[0]
    return Replicas([f.result() for f in futures], start=one)
