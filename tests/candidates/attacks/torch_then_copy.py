"""Item 4, what the values cannot tell: PyTorch computes the answer into a tensor of its own, by ops the
reference does not name (`mm`, then `clamp_min`), and a copy kernel writes it into the output. The output holds
what a kernel of the candidate's wrote last, and the decoy trial (the copy skipped) sees garbage: the kernel
was needed. Only the GPU's time share tells that PyTorch did the work (it scales the speed reward)."""
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
        answer = x.clamp_min(0.0)
        out = torch.empty_like(x)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](answer, out, x.numel(), BLOCK=1024)
        return out
