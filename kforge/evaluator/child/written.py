"""What the candidate's kernels wrote, by value: in a trial, the bytes of every storage a kernel of the
candidate's was handed, taken right after that launch, compared with the outputs the call returns.

The launch evidence counted an output as the kernel's when its storage was passed to a launch: a copy kernel
into the output, then PyTorch computing the answer into that same tensor (`out.clamp_min_(0.0)`,
`out.copy_(torch.log_softmax(out, -1).exp())`), was the kernel's work. Here the values decide: once a launch
of the candidate's returned, the whole device is synchronised and each storage it was handed (arguments, and
what a CUDA extension returned) is sampled: whole up to WHOLE_BYTES, else its first and last EDGE_BYTES
bytes and SAMPLED_BYTES bytes at positions drawn per storage and trial by a generator of the harness's own.
Only each storage's latest sample is kept, so memory is bounded by the storages a trial's launches hold
anyway. Each storage is also sampled right before a later launch on it: a launch that changed none of its
sampled bytes (masked off, or storing back what it loads) leaves the record as the launch before it left it,
so PyTorch's values written in between do not become the kernel's by a launch that did nothing. After the
call, an output whose storage holds other bytes than the last launch that changed it left is `overwritten`,
whatever wrote them (PyTorch, numpy, a library's kernel). Whether a launch changed anything is asked of the
storage as a whole, not byte by byte: a kernel may write a value a position already held (zeros over the
zeros an autotuner's reset left), which no byte could tell from not writing it.

A sampled storage is kept alive here, so its memory is never handed to another tensor while the trial runs;
a storage whose memory was moved or freed all the same (`share_memory_()`, `resize_(0)`) leaves its address
to whatever comes next, so an output over such an address counts as overwritten too.

Evidence like the rest of the child's: the candidate can rewrite it only with the in-process layers broken,
and it may add a flag, never remove one. What it cannot see: a launch of the candidate's that writes PyTorch's
result in as its own (a kernel that copies a tensor PyTorch computed into the output), nor a launch captured
into a CUDA graph, which leaves no sample. The torch functions used here are bound at import, before any
candidate code runs: replacing `torch.equal` later changes nothing here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from kforge.evaluator.child.isolation import SEAL_BROKEN, DispatchSeal, harness_only

# Bound before any candidate code runs (the module is imported with the harness).
_equal, _cat, _arange, _randint, _empty = torch.equal, torch.cat, torch.arange, torch.randint, torch.empty
_uint8, _Tensor, _Generator = torch.uint8, torch.Tensor, torch.Generator
_capturing = torch.cuda.is_current_stream_capturing

WHOLE_BYTES = 1 << 20  # a storage up to this size is kept whole
EDGE_BYTES = 4096  # else its first and last bytes,
SAMPLED_BYTES = 16384  # and this many at random positions (a multi-GB output costs no more)

Range = tuple[int, int]


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage as one flat uint8 tensor over the same memory (no copy)."""
    return _empty(0, dtype=_uint8, device=storage.device).set_(storage)


def storage_range(t: torch.Tensor) -> Range:
    """(start, end) address of the whole storage under `t`."""
    st = t.untyped_storage()
    return st.data_ptr(), st.data_ptr() + st.nbytes()


def storage_ranges(values: Iterable[object]) -> list[Range]:
    """The storage range of each non-empty tensor among `values` (arguments, inputs, outputs)."""
    return [storage_range(v) for v in values if isinstance(v, _Tensor) and v.numel()]


@dataclass
class Sample:
    """One storage the candidate's launches were handed, as the last of them left it."""

    flat: torch.Tensor  # its bytes (a view: it keeps the storage alive)
    where: torch.Tensor | None  # the positions sampled (None: all)
    was: torch.Tensor  # what they held right after the last launch on it that changed them
    before: torch.Tensor | None = None  # what they held right before the launch now running

    def moved(self, key: Range) -> bool:
        """Its memory is no longer at the address it was sampled at (moved to shared memory, resized)."""
        return storage_range(self.flat) != key or self.flat.numel() != key[1] - key[0]

    def now(self) -> torch.Tensor:
        return self.flat.clone() if self.where is None else self.flat.index_select(0, self.where)


class Written:
    """One trial's record of each storage the candidate's launches were handed."""

    def __init__(self, sync: Callable[[], None], on_gpu: bool = False, seal: DispatchSeal | None = None) -> None:
        self.sync, self.seal = sync, seal
        self.tampered = False  # the seal broke during a sample: no output of this trial counts as the kernel's
        self.capturing: Callable[[], bool] = _capturing if on_gpu else (lambda: False)
        self.gen = _Generator()
        self.gen.seed()  # from the system's random source: the positions are not the candidate's to know
        self.kept: dict[Range, Sample] = {}  # by the (start, end) address of the storage
        self.moved: set[Range] = set()  # addresses whose sampled storage moved away during the trial

    def _positions(self, n: int, device: torch.device) -> torch.Tensor | None:
        if n <= WHOLE_BYTES:
            return None
        edges = _cat([_arange(EDGE_BYTES), _arange(n - EDGE_BYTES, n)])
        return _cat([edges, _randint(0, n, (SAMPLED_BYTES,), generator=self.gen)]).to(device)

    def _storages(self, tensors: list[object]) -> dict[Range, torch.Tensor]:
        return {storage_range(t): t for t in tensors if isinstance(t, _Tensor) and t.numel()}

    def _known(self, key: Range) -> Sample | None:
        """The sample at `key`, unless its storage moved away (then the address is remembered as moved)."""
        sample = self.kept.get(key)
        if sample is not None and sample.moved(key):
            self.moved.add(key)
            del self.kept[key]
            return None
        return sample

    def _sealed(self) -> None:
        if self.seal is not None and not self.seal.intact():
            self.tampered = True
            raise RuntimeError(SEAL_BROKEN)

    def before_launch(self, tensors: list[object]) -> None:
        """A launch of the candidate's is about to run: what its storages hold now tells afterwards whether it
        changed anything."""
        if self.capturing():
            return
        self._sealed()
        with harness_only():
            self.sync()  # what the candidate enqueued before this launch has run
            for key in self._storages(tensors):
                sample = self._known(key)
                if sample is not None:
                    sample.before = sample.now()

    def after_launch(self, tensors: list[object]) -> None:
        """A launch of the candidate's returned: sample every storage it was handed, as it is now. A launch
        captured into a CUDA graph ran nothing yet (and a sync would break the capture): it leaves no sample."""
        if self.capturing():
            return
        self._sealed()
        with harness_only():
            self._after_launch(tensors)

    def _after_launch(self, tensors: list[object]) -> None:
        self.sync()  # the launch's work is done, and nothing the candidate enqueues after it has run yet
        for key, t in self._storages(tensors).items():
            sample = self._known(key)
            if sample is None:  # the first launch on it: whatever it held before is where the work starts
                flat = _bytes(t.untyped_storage())
                where = self._positions(key[1] - key[0], flat.device)
                self.kept[key] = Sample(flat, where, flat.clone() if where is None else flat.index_select(0, where))
                continue
            now = sample.now()
            if sample.before is None or not _equal(now, sample.before):  # it wrote something: its work now
                sample.was = now
            sample.before = None

    def overwritten(self, outputs: list[object]) -> int:
        """How many outputs share a storage with a launch of the candidate's and hold other bytes there than
        the last launch that changed it left (or lie over an address whose sampled storage moved away)."""
        self.sync()
        if self.tampered:
            return len(self._storages(outputs))
        count = 0
        for s, e in self._storages(outputs):
            hit = any(a < e and s < b for a, b in self.moved)
            for (a, b) in list(self.kept):
                if hit or not (a < e and s < b):
                    continue
                sample = self._known((a, b))
                hit = sample is None or not _equal(sample.now(), sample.was)
            count += hit
        return count
