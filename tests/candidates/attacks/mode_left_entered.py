"""Item 1: a copy kernel, and a TorchFunctionMode reached through a public path the static check did not ban
(`torch.fx.experimental.proxy_tensor.TorchFunctionMetadataMode`, which calls `tracer.torch_fn_counts.get`
before every torch call: a dict subclass of the candidate's answers), kept entered after forward by a
suspended generator. The harness's copy of the output into the arena was a torch call the mode saw: just
before it, PyTorch's clamp went into the output; just after, the kernel's bytes came back, so written.py saw
what the kernel left (`correct`, no flag, with every layer on). Now a call that returns with a mode entered
that was not entered before it is an error, and the harness's copy and evidence run with every mode off."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.fx.experimental.proxy_tensor import TorchFunctionMetadataMode


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


_state = {"armed": None, "saved": None}


def seen(func):
    saved = _state["saved"]
    if saved is not None:  # the first torch call after the arena copy: put the kernel's bytes back
        _state["saved"] = None
        saved[0].copy_(saved[1])
    out = _state["armed"]
    if out is not None and func is torch.Tensor.copy_:  # the harness copies the output to the arena
        _state["armed"] = None
        _state["saved"] = (out, out.clone())
        out.clamp_(min=0.0)


class Counts(dict):
    def get(self, func, default=None):
        seen(func)
        return 0


class Tracer:
    def __init__(self):
        self.torch_fn_counts = Counts()
        self.torch_fn_metadata = None


def stay():
    with TorchFunctionMetadataMode(Tracer()):
        yield 1
        yield 2


_kept = []


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.full_like(x, float("nan"))
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        _state["armed"] = out
        if not _kept:
            g = stay()
            next(g)
            _kept.append(g)
        return out
