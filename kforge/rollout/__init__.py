"""Generation backends behind one interface: `hf` (transformers) and `vllm` (engine in a worker process).

`kforge.rollout.factory.make_backend` picks and builds one; this package's root imports no backend.
"""

from kforge.rollout.base import BackendError, Completion, GenerationRequest, RolloutBackend, SamplingParams

__all__ = ["BackendError", "Completion", "GenerationRequest", "RolloutBackend", "SamplingParams"]
