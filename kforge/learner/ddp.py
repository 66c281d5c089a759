"""Data-parallel ranks of the LoRA learner: one process per GPU, joined in a torch.distributed group.

Every rank gets the whole batch and takes the same decisions from it (the minibatch split, the samples
left out, the dropout seed, broadcast from rank 0); each then runs forward and backward only on its shard
of every minibatch, cut by tokens so that the ranks finish together. The loss normalisers (total response
tokens, total sequences) are summed over the ranks, so a rank's loss is its share of the one-rank loss and
the sum of the ranks' gradients is the one-rank gradient: the update is the same for any rank count.

Only the LoRA parameters' gradients travel, one flat all-reduce per optimiser step (a few MB; the frozen
base never does). torch's DistributedDataParallel is not used: the learner takes each micro-batch's
gradients with autograd.grad and adds them only once the micro-batch completed (its out-of-memory retry),
which DDP's backward hooks never see. NCCL on GPUs, gloo on the CPU (tests).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Sequence

import torch

from kforge.learner.sums import Sums

if TYPE_CHECKING:  # annotations only
    from kforge.credit.samples import Sample


@dataclass(frozen=True)
class Rendezvous:
    """Where rank `rank` of `world` meets the others (rank 0 listens on `port`)."""

    rank: int
    world: int
    port: int
    address: str = "127.0.0.1"
    timeout_s: float = 1800.0


def free_port(address: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def shard_by_tokens(lengths: Sequence[int], world: int) -> list[list[int]]:
    """Indices per rank, the longest first to the rank with the fewest tokens so far (ties: lowest rank),
    each rank's list in the input order. Every rank computes the same shards from the same lengths."""
    shards: list[list[int]] = [[] for _ in range(world)]
    load = [0] * world
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        r = min(range(world), key=lambda r: (load[r], r))
        shards[r].append(i)
        load[r] += lengths[i]
    return [sorted(s) for s in shards]


class Ranks:
    """This process's place in the learner's group. With one rank (no rendezvous) every call is the identity,
    so the learner reads the same with or without a group."""

    def __init__(self, rendezvous: Rendezvous | None = None, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", 0)  # a rank's process sees its one GPU only
        self.rank, self.world = (rendezvous.rank, rendezvous.world) if rendezvous else (0, 1)
        self._dist: Any = None
        if rendezvous is not None and rendezvous.world > 1:
            import torch.distributed as dist

            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            dist.init_process_group(
                "nccl" if self.device.type == "cuda" else "gloo",
                init_method=f"tcp://{rendezvous.address}:{rendezvous.port}",
                rank=rendezvous.rank, world_size=rendezvous.world,
                timeout=timedelta(seconds=rendezvous.timeout_s),
            )
            self._dist = dist

    def shard(self, samples: list[Sample]) -> list[Sample]:
        """This rank's samples of a minibatch, balanced by tokens (prompt + response: what a forward costs)."""
        if self._dist is None:
            return samples
        return [samples[i] for i in shard_by_tokens([s.num_tokens for s in samples], self.world)[self.rank]]

    def sum_floats(self, values: list[float]) -> list[float]:
        if self._dist is None:
            return values
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        self._dist.all_reduce(t)
        return [float(v) for v in t.tolist()]

    def sum_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Every rank's .grad becomes the sum over the ranks (a rank with no samples adds zeros). A parameter
        no rank has a gradient for keeps none, as with one rank (AdamW then leaves it alone)."""
        if self._dist is None:
            return
        has = [float(p.grad is not None) for p in params]
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float() for p in params]
                         + [torch.tensor(has, device=self.device)])
        self._dist.all_reduce(flat)
        flags, offset = flat[-len(params):].tolist(), 0
        for p, flag in zip(params, flags):
            n = p.numel()
            p.grad = flat[offset:offset + n].view_as(p).to(p.dtype) if flag > 0 else None
            offset += n

    def broadcast_params(self, params: list[torch.nn.Parameter]) -> None:
        """Rank 0's values everywhere: a fresh adapter is initialised at random, and every rank must start
        from the same one."""
        if self._dist is None:
            return
        with torch.no_grad():
            for p in params:
                self._dist.broadcast(p.data, src=0)

    def broadcast_int(self, value: int | None) -> int | None:
        if self._dist is None or value is None:
            return value
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        self._dist.broadcast(t, src=0)
        return int(t.item())

    def merge(self, sums: Sums, stats: dict[str, float]) -> None:
        """The step's token-weighted sums over every rank (sums add, maxima take the largest)."""
        if self._dist is None:
            return
        gathered: list[Any] = [None] * self.world
        self._dist.all_gather_object(gathered, (sums.tokens, sums.values, sums.maxima, stats["tokens"]))
        sums.tokens = sum(g[0] for g in gathered)
        sums.values = {k: sum(g[1].get(k, 0.0) for g in gathered) for g in gathered for k in g[1]}
        sums.maxima = {k: max(g[2][k] for g in gathered if k in g[2]) for g in gathered for k in g[2]}
        stats["tokens"] = sum(g[3] for g in gathered)

    def close(self) -> None:
        if self._dist is not None and self._dist.is_initialized():
            self._dist.destroy_process_group()
        self._dist = None
