"""Item 4: a kernel zero-fills the small output (filled with NaN first, so the decoy trial, which skips the
kernel, sees NaN: the kernel is "needed"), then PyTorch adds the whole product into it with `torch.einsum`, an
op the reference (`torch.matmul`) does not name. The output was handed to a kernel, so it counted as the
kernel's; and since a kernel touched it, it was not among the small outputs whose GPU share is asked."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def zero_kernel(y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.zeros([BLOCK], dtype=tl.float32), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, a, b):
        out = torch.full((a.shape[0], b.shape[1]), float("nan"), device=a.device, dtype=a.dtype)
        zero_kernel[(triton.cdiv(out.numel(), 1024),)](out, out.numel(), BLOCK=1024)
        out.add_(torch.einsum("mk,kn->mn", a, b))
        return out
