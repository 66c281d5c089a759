"""A correct Triton MSE loss: the kernel sums the squared differences into a one-value accumulator and PyTorch
divides by the count. No kernel of the candidate's writes the output itself (a 4-byte result PyTorch finished),
which must not be taken for PyTorch doing the work."""
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def sq_diff_sum(p_ptr, t_ptr, acc_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    d = tl.load(p_ptr + offs, mask=mask, other=0.0) - tl.load(t_ptr + offs, mask=mask, other=0.0)
    tl.atomic_add(acc_ptr, tl.sum(d * d, axis=0))


class ModelNew(nn.Module):
    def forward(self, predictions, targets):
        p, t = predictions.contiguous(), targets.contiguous()
        acc = torch.zeros((), device=p.device, dtype=torch.float32)
        sq_diff_sum[(triton.cdiv(p.numel(), 8192),)](p, t, acc, p.numel(), BLOCK=8192)
        return acc / p.numel()
