"""Which generation backend a config asks for, and building it: the only module that imports both.

Backends import `kforge.rollout.base`; this module imports the backends. Keeping the factory out of
`base` is what keeps the package free of an import circle.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING, Any

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


def make_backend(cfg: "KforgeConfig", devices: list[int] | None = None, **kwargs: Any) -> RolloutBackend:
    """The configured backend on `devices`: logical GPU indices as this process sees them (the vLLM worker
    maps them to physical ids through `kforge.gpus` for its own CUDA_VISIBLE_DEVICES). None: the hf backend
    takes GPU 0 when there is one, the vLLM worker the GPUs this process sees. Extra keyword arguments go
    to the backend's constructor."""
    kind = choose_backend(cfg.rollout.backend)
    if kind == "vllm":
        from kforge.rollout.vllm_worker import VLLMBackend

        return VLLMBackend.from_config(cfg, devices, **kwargs)
    from kforge.rollout.hf import HFBackend

    return HFBackend.from_config(cfg, devices, **kwargs)
