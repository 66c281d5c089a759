"""What one `kforge eval` runs on, built in one place as `kforge train`'s parts are (train/build.py): the
sandboxed pool, and for a target that generates, the rollout backend with the target's adapter loaded and the
episode runner. `EvalRun` receives them; the caller closes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from kforge.config.schema import KforgeConfig
from kforge.eval.target import Target

if TYPE_CHECKING:
    from kforge.evaluator import EvalPool
    from kforge.policy.runner import EpisodeRunner
    from kforge.rollout.base import RolloutBackend


@dataclass
class EvalParts:
    pool: "EvalPool"
    backend: "RolloutBackend | None" = None  # None: given kernels, or nothing left to generate
    runner: "EpisodeRunner | None" = None

    def close(self) -> None:
        try:
            if self.backend is not None:
                self.backend.close()
        finally:
            self.pool.close()


def generation_parts(cfg: KforgeConfig, target: Target, pool: "EvalPool", backend: "RolloutBackend") -> EvalParts:
    """The parts around a backend made for `target`: its adapter loaded, and an episode runner that judges every
    sample on its own (no verdict cache between samples: each is a draw of the model, not a repeat)."""
    from kforge.policy.runner import EpisodeRunner
    from kforge.rag import retriever_for

    if target.adapter:
        backend.load_adapter(target.adapter, 1)
    runner = EpisodeRunner.from_config(cfg, backend, pool.evaluate, retriever_for(cfg.dataset), cache=False)
    return EvalParts(pool, backend, runner)


def build_parts(cfg: KforgeConfig, target: Target | None, devices: list[int] | None, generate: bool,
                tell: Callable[[str], None] = lambda stage: None) -> EvalParts:
    """The pool on `devices`, then (with `generate`) the target's model: nothing is loaded for given kernels or
    for a resumed eval with every sample done. Parts built before a failure are closed here."""
    from kforge.evaluator import EvalPool
    from kforge.rollout.factory import make_backend

    tell("starting the evaluator")
    pool = EvalPool(cfg.evaluator, devices=devices or None)
    if not generate or target is None:
        return EvalParts(pool)
    backend = None
    try:
        tell(f"loading {target.model}" + (f" with {target.adapter}" if target.adapter else ""))
        backend = make_backend(cfg, devices)
        return generation_parts(cfg, target, pool, backend)
    except BaseException:
        EvalParts(pool, backend).close()
        raise
