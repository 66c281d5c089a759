"""Item 4: copy_then_clamp.py with one more launch of the same kernel on the output, masked off entirely
(n = 0): it writes nothing, but the sample taken after it held PyTorch's clamp, so the output counted as the
kernel's. written.py now samples each storage right before a launch too: bytes something else wrote since
the last launch stay foreign until a launch changes them."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def copy_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        out = torch.full_like(x, float("nan"))
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        out.clamp_min_(0.0)
        copy_kernel[(1,)](out, out, 0, BLOCK=16)  # touches nothing
        return out
