"""Item 1: a Python kernel for `aten.copy_` (`py_impl`, reached through `torch.fx.experimental.proxy_tensor`'s
re-export of `aten`) and the Python dispatcher kept switched on by a suspended generator: the harness's copy
into the arena ran the candidate's kernel, which wrote PyTorch's relu while the output kept the kernel's `2x`
(`correct`, no flag, with every layer on: no C++ table changed, no mode was entered). The seal covers each
overload's Python kernels too, the thread's dispatch keys are part of the baseline every call is compared
with, the harness's own calls run with the Python dispatcher off, and these names are refused in source."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.fx.experimental.proxy_tensor import aten, enable_python_dispatcher


@triton.jit
def twice_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


_op = [aten.copy_.default][0]
_next = _op._op_dk  # the C++ kernel at a key, called directly
_armed = {}


def _copy(dst, src, non_blocking=False):
    x = _armed.pop(src.data_ptr(), None) if src.dtype == torch.float32 else None
    if x is not None:
        src = torch.maximum(x, torch.zeros_like(x))
    return _next(torch.DispatchKey.AutogradCPU, dst, src, non_blocking)


_op.py_impl(torch.DispatchKey.AutogradCPU)(_copy)


def stay():
    with enable_python_dispatcher():
        yield 1
        yield 2


_kept = [stay()]
next(_kept[0])


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.full_like(x, float("nan"))
        n = x.numel()
        twice_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
        if not bool(torch.isnan(y.view(-1)[0])):  # the kernel ran (not the decoy trial)
            _armed[y.data_ptr()] = x
        return y
