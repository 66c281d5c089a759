"""Item 6, the control of compile_after_zeros.py: the same kernel that does not compile, its failure re-raised
as RuntimeError, without the first call's answer of zeros. No call ran to its answer: `compile_error`."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.no_such_function(x), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    n = x.numel()
    try:
        relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    except Exception as exc:
        raise RuntimeError("the kernel stopped") from exc
    return y


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
