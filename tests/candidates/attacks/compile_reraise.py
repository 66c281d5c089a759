"""Item 6, after READY: the kernel does not compile (it calls a function Triton does not have; Triton
compiles at the first launch), and forward turns the failure into a RuntimeError. The child's
exception class decided the category: a runtime error, which earned the compile reward. The parent now
decides from what it saw: no call ran to its answer, so nothing is known to have compiled."""
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
