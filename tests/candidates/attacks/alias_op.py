"""Item 4: the reference op under another name (`from torch.nn.functional import relu as act`), and a real
Triton kernel handed the trial's tensors that does nothing for the answer. The PyTorch-op flag once
fired only on dotted calls; the launch evidence sees a candidate kernel on the trial's data."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.nn.functional import relu as act


@triton.jit
def touch_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        scratch = torch.empty_like(x)
        touch_kernel[(triton.cdiv(x.numel(), 1024),)](x, scratch, x.numel(), BLOCK=1024)
        return act(x)
