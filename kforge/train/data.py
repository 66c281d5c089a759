"""The order in which training problems are visited: deterministic per (seed, epoch), resumable; the seeds
of each step's sampling, drawn from (seed, step)."""

from __future__ import annotations

import hashlib
import math
import random
from dataclasses import dataclass, field

from kforge.errors import UserError
from kforge.problems.record import Problem


@dataclass
class ProblemSampler:
    problems: list[Problem]
    batch_size: int
    epochs: int
    shuffle: bool = True
    seed: int = 0
    epoch: int = 0
    cursor: int = 0
    _order: list[int] = field(default_factory=list, repr=False)
    _orders: dict[int, list[int]] = field(default_factory=dict, repr=False)  # problem_at's epoch order

    def __post_init__(self) -> None:
        if not self.problems:
            raise UserError("no training problems: check dataset.source / level / start_problem / end_problem")
        # Problems are sorted by key so the order depends on the seed alone, not on how a source listed them.
        self.problems = sorted(self.problems, key=lambda p: (p.level, p.problem_id))
        self._order = self._epoch_order(self.epoch)

    @property
    def steps_per_epoch(self) -> int:
        return max(1, math.ceil(len(self.problems) / self.batch_size))

    @property
    def total_steps(self) -> int:
        return self.steps_per_epoch * self.epochs

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.problems)))
        if self.shuffle:
            random.Random(f"{self.seed}/{epoch}").shuffle(order)
        return order

    def next_batch(self) -> list[Problem] | None:
        """The next B problems, or None once every epoch is done. A batch larger than the split takes
        every problem once (a group of trajectories per problem is what GRPO needs, not repeats)."""
        if self.epoch >= self.epochs:
            return None
        take = self._order[self.cursor : self.cursor + self.batch_size]
        self.cursor += self.batch_size
        if self.cursor >= len(self._order):
            self.epoch += 1
            self.cursor = 0
            self._order = self._epoch_order(self.epoch)
        return [self.problems[i] for i in take]

    def problem_at(self, n: int) -> Problem:
        """The n-th problem of the visiting order (epoch after epoch, each N long, past the last epoch too):
        continuous rollouts draw one group at a time by this index."""
        epoch, pos = divmod(n, len(self.problems))
        if epoch not in self._orders:
            self._orders = {epoch: self._epoch_order(epoch)}  # one epoch at a time is read, in order
        return self.problems[self._orders[epoch][pos]]

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._order = self._epoch_order(self.epoch)


def step_seed(seed: int, step: int, salt: str = "") -> int:
    digest = hashlib.sha256(f"{seed}/{step}/{salt}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


def seed_everything(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)
