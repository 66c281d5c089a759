"""Generation backends behind one interface: `hf` (transformers) and `vllm` (engine in a worker process)."""

from kforge.rollout.base import (
    BackendError,
    Completion,
    GenerationRequest,
    RolloutBackend,
    SamplingParams,
    make_backend,
)

__all__ = ["BackendError", "Completion", "GenerationRequest", "RolloutBackend", "SamplingParams", "make_backend"]
