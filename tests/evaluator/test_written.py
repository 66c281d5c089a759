"""written.py on its own, with CPU tensors standing in for a trial's launches: what a launch of the
candidate's left in each storage decides whether an output is its work (`overwritten` counts those that are
not). The pool runs the same through the corpus (tests/candidates/attacks/: clamp_then_noop_launch.py,
storage_swap.py, storage_reuse.py); here each rule alone, honest patterns beside the attacks."""

from __future__ import annotations

import numpy as np
import torch

from kforge.evaluator.child.written import Written


def _launch(written: Written, *tensors: torch.Tensor, write=None) -> None:
    """A launch of the candidate's on `tensors`: `write` (the kernel's work) runs between the two samples."""
    written.before_launch(list(tensors))
    if write is not None:
        write()
    written.after_launch(list(tensors))


def test_a_kernels_own_output_is_its_work_and_pytorch_after_it_is_not():
    x = torch.randn(64)
    w = Written(lambda: None)
    out = torch.empty(64)
    _launch(w, x, out, write=lambda: out.copy_(x.relu()))
    assert w.overwritten([out]) == 0
    out.add_(1.0)  # PyTorch after the kernel's last launch
    assert w.overwritten([out]) == 1


def test_a_launch_that_changes_nothing_does_not_make_pytorchs_values_the_kernels():
    x = torch.randn(64)
    w = Written(lambda: None)
    out = torch.empty(64)
    _launch(w, x, out, write=lambda: out.copy_(x))  # the copy kernel
    out.clamp_min_(0.0)  # PyTorch's answer
    _launch(w, out)  # masked off: writes nothing
    assert w.overwritten([out]) == 1
    # Stored back as loaded: the same.
    w2, out2 = Written(lambda: None), torch.empty(64)
    _launch(w2, x, out2, write=lambda: out2.copy_(x))
    out2.clamp_min_(0.0)
    _launch(w2, out2, write=lambda: out2.copy_(out2.clone()))
    assert w2.overwritten([out2]) == 1


def test_a_later_launch_that_writes_anything_makes_the_storage_its_work_again():
    """Asked of the storage as a whole: an autotuner's reset to zero between benchmark launches, then a launch
    that writes values some of which are zero (a ReLU), is honest; no byte could tell those zeros apart."""
    x = torch.randn(64)
    w = Written(lambda: None)
    out = torch.empty(64)
    _launch(w, x, out, write=lambda: out.copy_(x.relu()))
    out.zero_()  # the autotuner's reset_to_zero before its next benchmark launch
    _launch(w, x, out, write=lambda: out.copy_(x.relu()))
    assert w.overwritten([out]) == 0


def test_an_output_where_a_sampled_storage_moved_away_is_overwritten():
    x = torch.randn(64)
    w = Written(lambda: None)
    arr = np.full(64, np.nan, dtype=np.float32)
    buf = torch.from_numpy(arr)
    _launch(w, x, buf, write=lambda: buf.copy_(x))
    buf.untyped_storage().share_memory_()  # its bytes move away; the array keeps the old memory alive
    out = torch.from_numpy(arr)  # over the address the launch was handed, not the storage sampled there
    out.copy_(x.relu())
    assert w.overwritten([out]) == 1


def test_the_first_launch_on_a_storage_starts_its_record_whatever_it_held():
    w = Written(lambda: None)
    out = torch.full((64,), float("nan"))
    _launch(w, out, write=lambda: out[:32].fill_(1.0))  # writes half: the other half is the buffer's own
    assert w.overwritten([out]) == 0
