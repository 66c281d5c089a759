"""Item 4: a copy kernel writes x into the output it allocated, then PyTorch computes the answer into that same
tensor (`clamp_min_`, an op the reference never names). The output was handed to a kernel of the candidate's,
so it counted as the kernel's; the decoy trial sees the kernel needed (without the copy, the clamp of an empty
tensor is garbage). PyTorch did all the work."""
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
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        out.clamp_min_(0.0)
        return out
