"""Item 3: a report that is not a time. Every timed call is reported at -0.5 ms: a negative mean passed the
old allowance (the parent's clock minus an allowance of 4x the report plus 10 ms on a CPU) and made
speedups meaningless."""
import sys
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


_cls = sys.modules["kforge.evaluator.child.loop"].RequestLoop
_timed = _cls.timed


def _negative(self, req):
    msg = _timed(self, req)
    msg["ms"] = -0.5
    return msg


_cls.timed = _negative


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
