"""What the candidate's kernels wrote, by value: in a trial, the bytes of every storage a kernel of the
candidate's was handed, taken right after that launch, compared with the outputs the call returns.

The launch evidence counted an output as the kernel's when its storage was passed to a launch: a copy kernel
into the output, then PyTorch computing the answer into that same tensor (`out.clamp_min_(0.0)`,
`out.copy_(torch.log_softmax(out, -1).exp())`), was the kernel's work. Here the values decide: once a launch
of the candidate's returned, the whole device is synchronised and each storage it was handed (arguments, and
what a CUDA extension returned) is sampled: whole up to WHOLE_BYTES, else its first and last EDGE_BYTES
bytes and SAMPLED_BYTES bytes at positions drawn per storage and trial by a generator of the harness's own.
Only each storage's latest sample is kept, so memory is bounded by the storages a trial's launches hold
anyway. After the call, an output whose storage's bytes differ from that latest sample was written after the
candidate's last launch on it, by whatever did it (PyTorch, numpy, a library's kernel): `overwritten`.

Evidence like the rest of the child's: the candidate can rewrite it only with the in-process layers broken,
and it may add a flag, never remove one. What it cannot see: a launch of the candidate's on the output after
PyTorch's op (a kernel that stores back what it loads, or copies PyTorch's result in): the values are then what
a kernel wrote last; nor a launch captured into a CUDA graph, which leaves no sample.
"""

from __future__ import annotations

from typing import Callable

import torch

WHOLE_BYTES = 1 << 20  # a storage up to this size is kept whole
EDGE_BYTES = 4096  # else its first and last bytes,
SAMPLED_BYTES = 16384  # and this many at random positions (a multi-GB output costs no more)

Range = tuple[int, int]


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    """The storage as one flat uint8 tensor over the same memory (no copy)."""
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


class Written:
    """One trial's latest sample of each storage the candidate's launches were handed."""

    def __init__(self, sync: Callable[[], None], on_gpu: bool = False) -> None:
        self.sync = sync
        self.capturing: Callable[[], bool] = torch.cuda.is_current_stream_capturing if on_gpu else (lambda: False)
        self.gen = torch.Generator()
        self.gen.seed()  # from the system's random source: the positions are not the candidate's to know
        # (start, end) of a storage -> its bytes, the positions sampled (None: all), the values they held
        self.kept: dict[Range, tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]] = {}

    def _positions(self, n: int, device: torch.device) -> torch.Tensor | None:
        if n <= WHOLE_BYTES:
            return None
        edges = torch.cat([torch.arange(EDGE_BYTES), torch.arange(n - EDGE_BYTES, n)])
        return torch.cat([edges, torch.randint(0, n, (SAMPLED_BYTES,), generator=self.gen)]).to(device)

    @staticmethod
    def _read(flat: torch.Tensor, where: torch.Tensor | None) -> torch.Tensor:
        return flat.clone() if where is None else flat.index_select(0, where)

    def after_launch(self, tensors: list[object]) -> None:
        """A launch of the candidate's returned: sample every storage it was handed, as it is now. A launch
        captured into a CUDA graph ran nothing yet (and a sync would break the capture): it leaves no sample."""
        if self.capturing():
            return
        self.sync()  # the launch's work is done, and nothing the candidate enqueues after it has run yet
        for t in tensors:
            if not isinstance(t, torch.Tensor) or not t.numel():
                continue
            st = t.untyped_storage()
            key = (st.data_ptr(), st.data_ptr() + st.nbytes())
            if key in self.kept:  # the same positions as its earlier launches in this trial
                flat, where, _ = self.kept[key]
            else:
                flat = _bytes(st)
                where = self._positions(st.nbytes(), flat.device)
            self.kept[key] = (flat, where, self._read(flat, where))

    def overwritten(self, outputs: list[object]) -> int:
        """How many outputs share a storage with a launch of the candidate's and hold other bytes there than
        right after the last such launch."""
        self.sync()
        count = 0
        for o in outputs:
            if not isinstance(o, torch.Tensor) or not o.numel():
                continue
            st = o.untyped_storage()
            s, e = st.data_ptr(), st.data_ptr() + st.nbytes()
            if any(a < e and s < b and not torch.equal(self._read(flat, where), was)
                   for (a, b), (flat, where, was) in self.kept.items()):
                count += 1
        return count
