"""The learner in its own process on its own GPUs, served through `kforge.served`.

The trainer's process never initialises CUDA for the learner: the spawned child starts with the learner's
CUDA_VISIBLE_DEVICES (its logical GPU indices mapped through `kforge.gpus`, as for the rollout worker and
the eval pool), builds the Learner there and answers calls. Every call has a deadline
(`learner.call_timeout_s`): a learner that dies or hangs is reported within it, and the run saves what
it can and fails with the reason (`--resume` continues from the last checkpoint). On a CPU-only machine
the learner stays in-process so the hf rollout backend can share its weights.

Several learner GPUs give one rank per GPU (`kforge.learner.ddp`), each its own served process seeing only
its GPU: every rank gets every call that changes the adapter (they step together), and rank 0 alone writes
adapters and checkpoints (every rank holds the same weights). A rank that fails fails the call at once.
"""

from __future__ import annotations

import concurrent.futures as cf
from typing import TYPE_CHECKING, Any

from kforge.gpus import child_visible_devices
from kforge.rollout.base import SamplingParams
from kforge.served import ServedError, ServedProcess

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from kforge.config.schema import KforgeConfig
    from kforge.credit.samples import Sample
    from kforge.learner.recompute import Choice

DEFAULT_FACTORY = "kforge.train.learner_proc:LearnerService"


class LearnerDied(RuntimeError):
    """The learner process died, hung past its deadline or failed; one line for the user first."""


class LearnerService:
    """What the child serves: the Learner, with the policy version returned where it changes."""

    def __init__(self, cfg_json: dict[str, Any], total_steps: int | None, sampling: SamplingParams,
                 device: str = "cuda", rendezvous: dict[str, Any] | None = None, reserve_gib: float = 0.0) -> None:
        from kforge.config.schema import KforgeConfig
        from kforge.learner.ddp import Ranks, Rendezvous
        from kforge.learner.learner import Learner

        cfg = KforgeConfig.model_validate(cfg_json)
        ranks = Ranks(Rendezvous(**rendezvous) if rendezvous else None, device)
        model, tokenizer = self.base_model(cfg, device)
        # Log-probs under the rollout's sampling settings, as the engine reports them (IS ratios).
        self.learner = Learner(cfg, device=device, model=model, tokenizer=tokenizer, total_steps=total_steps,
                               sampling=sampling, ranks=ranks, reserve_gib=reserve_gib)

    def base_model(self, cfg: KforgeConfig,
                   device: str) -> tuple[PreTrainedModel | None, PreTrainedTokenizerBase | None]:
        """(model, tokenizer) to train, or (None, None): the Learner loads `cfg.model` itself."""
        return None, None

    def version(self) -> int:
        return int(self.learner.version)

    def recompute(self) -> Choice | None:
        return self.learner.recompute

    def train_step(self, samples: list[Sample]) -> tuple[dict[str, float], int]:
        # Out-of-memory handling (smaller micro-batches) lives inside Learner.train_step.
        return self.learner.train_step(samples), int(self.learner.version)

    def save_adapter(self, path: str, dtype: str | None = None) -> None:
        self.learner.save_adapter(path, dtype)

    def save_checkpoint(self, path: str) -> None:
        self.learner.save_checkpoint(path)

    def load_checkpoint(self, path: str) -> int:
        self.learner.load_checkpoint(path)
        return int(self.learner.version)

    def close(self) -> None:
        self.learner.ranks.close()


class LearnerProcess:
    """The Learner's interface (train_step, save_adapter, save/load_checkpoint, version) over its processes."""

    def __init__(self, cfg: KforgeConfig, devices: list[int], total_steps: int | None = None, *,
                 sampling: SamplingParams, factory: str = DEFAULT_FACTORY,
                 factory_kwargs: dict[str, Any] | None = None, log_path: str | None = None,
                 start_timeout_s: float = 1800.0, cpu_ranks: int = 1, reserve_gib: float = 0.0) -> None:
        """`devices`: logical GPU indices as this process sees them, one rank each; none = the CPU, with
        `cpu_ranks` ranks (gloo: the tests of the data-parallel learner). `sampling`: the sampler's settings,
        which every rank's Learner scores tokens under. `reserve_gib`: GPU memory the other
        roles keep on a learner GPU while it trains (Plan.learner_reserve_gib)."""
        from kforge.learner.ddp import free_port

        self.timeout_s = float(cfg.learner.call_timeout_s)
        world = len(devices) if devices else max(1, cpu_ranks)
        kwargs = {"cfg_json": cfg.model_dump(mode="json"), "total_steps": total_steps, "sampling": sampling,
                  "device": "cuda" if devices else "cpu", "reserve_gib": reserve_gib, **(factory_kwargs or {})}
        # One GPU per rank; CPU ranks see none.
        envs = [{"CUDA_VISIBLE_DEVICES": child_visible_devices(devices[r:r + 1] if devices else [])}
                for r in range(world)]
        port = free_port() if world > 1 else 0

        def start(rank: int) -> ServedProcess:
            # A collective waiting for a rank that died gives up within the call deadline.
            meet = {"rank": rank, "world": world, "port": port, "timeout_s": self.timeout_s}
            rank_kwargs = dict(kwargs, rendezvous=meet) if world > 1 else kwargs
            path = log_path if rank == 0 or not log_path else f"{log_path.removesuffix('.log')}.rank{rank}.log"
            return ServedProcess(factory, rank_kwargs, name="learner" if rank == 0 else f"learner rank {rank}",
                                 env=envs[rank], log_path=path, start_timeout_s=start_timeout_s)

        # The ranks meet while they start, so they must all be starting at once.
        self._pool = cf.ThreadPoolExecutor(max_workers=world, thread_name_prefix="kforge-learner-call")
        started = [self._pool.submit(start, r) for r in range(world)]
        self._procs: list[ServedProcess] = []
        errors = []
        for fut in started:
            try:
                self._procs.append(fut.result())
            except ServedError as exc:
                errors.append(exc)
        if errors:
            self.close()
            raise LearnerDied(f"the learner process failed to start: {errors[0]}") from None
        # Cached so that the next step's rollouts can read it while a train_step is in flight (pipelined).
        self._version = int(self._call("version"))
        # The learner's recompute choice (kforge.learner.recompute.Choice, None without checkpointing), for the log.
        self.recompute = self._call("recompute")

    def _call(self, method: str, **kwargs: object) -> Any:  # noqa: ANN401  the learner's answer: what its method returns
        try:
            return self._procs[0].call(method, timeout_s=self.timeout_s, **kwargs)
        except ServedError as exc:
            raise LearnerDied(str(exc)) from None

    def _call_all(self, method: str, **kwargs: object) -> Any:  # noqa: ANN401  the learner's answer: what its method returns
        """The call on every rank at once (they meet in collectives); rank 0's answer. The first rank to
        fail fails the call: the others would wait for it in a collective until their deadline."""
        if len(self._procs) == 1:
            return self._call(method, **kwargs)
        futs = [self._pool.submit(p.call, method, timeout_s=self.timeout_s, **kwargs) for p in self._procs]
        cf.wait(futs, return_when=cf.FIRST_EXCEPTION)
        for fut in futs:
            if fut.done() and fut.exception() is not None:
                raise LearnerDied(str(fut.exception())) from None
        return futs[0].result()

    def train_step(self, samples: list[Sample]) -> dict[str, float]:
        metrics, self._version = self._call_all("train_step", samples=samples)
        return metrics

    def save_adapter(self, path: str, dtype: str | None = None) -> None:
        self._call("save_adapter", path=str(path), dtype=dtype)

    def save_checkpoint(self, path: str) -> None:
        self._call("save_checkpoint", path=str(path))

    def load_checkpoint(self, path: str) -> None:
        self._version = int(self._call_all("load_checkpoint", path=str(path)))

    @property
    def version(self) -> int:
        return self._version

    @property
    def ranks(self) -> int:
        return len(self._procs)

    def alive(self) -> bool:
        return bool(self._procs) and all(p.alive() for p in self._procs)

    def close(self) -> None:
        for p in self._procs:
            p.close(timeout_s=30)
        self._pool.shutdown(wait=False, cancel_futures=True)
