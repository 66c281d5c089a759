"""The evaluator: sandboxed, cached, hack-resistant checking and timing of candidate kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kforge.evaluator.verdict import Status, Timings, Verdict

if TYPE_CHECKING:
    from kforge.evaluator.pool import EvalPool

__all__ = ["EvalPool", "Status", "Timings", "Verdict"]


def __getattr__(name: str) -> type[EvalPool]:
    # Imported lazily: the pool pulls in torch, and the zygote/children import this package too.
    if name == "EvalPool":
        from kforge.evaluator.pool import EvalPool

        return EvalPool
    raise AttributeError(name)
