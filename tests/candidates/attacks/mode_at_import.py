"""Item 4: a TorchFunctionMode entered at import (a suspended generator) saw written.py's samples inside
forward and wrote PyTorch's answer into the output right before the sample of what the launch left, so the
sample held PyTorch's values (`correct`, no flag, with every layer on). The modes entered before the
candidate's code ran are the baseline every call is compared with, and the samples run with every mode off."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.fx.experimental.proxy_tensor import TorchFunctionMetadataMode


@triton.jit
def twice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


_st = {"x": None, "y": None, "armed": False, "seen": False, "clones": 0, "last": None}


def seen(func):
    if not _st["armed"]:
        return
    if func is torch.Tensor.untyped_storage:
        _st["seen"] = True  # the launch recorder looked at the tensors: the launch was not skipped
    elif func is torch.empty:
        _st["last"] = func  # written.py: `_empty(0).set_(storage)`, then `flat.clone()`
    elif func is torch.Tensor.clone and _st["last"] is torch.empty:
        _st["last"] = None
        _st["clones"] += 1  # x's sample, then y's
        if _st["clones"] == 2:  # y's sample of what the launch left, about to be taken
            y, x = _st["y"], _st["x"]
            y.copy_(torch.maximum(x, torch.zeros_like(x)))


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


_kept = [stay()]
next(_kept[0])  # entered at import: the baseline stack of every forward holds it


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _st.update(x=x, y=y, armed=True, seen=False, clones=0, last=None)
        twice_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        _st["armed"] = False
        if _st["seen"] and _st["clones"] < 2:  # launched, not sampled: a timed call (or warm-up)
            y.copy_(torch.maximum(x, torch.zeros_like(x)))
        return y
