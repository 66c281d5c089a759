"""An honest kernel whose wrapper checks the kernel's output and raises when it looks unwritten. In the
decoy trial (its launches skipped) it raises: the child is replaced by a fresh one for the remaining
trials, which it passes."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.full_like(x, float("nan"))
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        if bool(torch.isnan(y).any()):
            raise RuntimeError("the kernel left values unwritten")
        return y
