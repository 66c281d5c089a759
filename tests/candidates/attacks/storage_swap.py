"""Item 4: written.py and the launch evidence knew a storage by its address range only. A copy kernel writes x
into a tensor over a numpy array's memory (sampled right after the launch); `share_memory_()` then moves that
storage's bytes to new memory while the array, still held, keeps the old memory; a second tensor over the
array gets PyTorch's whole answer and is returned: it lies over the range the launch was handed, and the
storage sampled (moved) still holds what the kernel wrote. written.py now sees that the storage it sampled
is no longer at its address, and counts an output there as overwritten."""
import numpy as np
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
        arr = np.full(x.numel(), np.nan, dtype=np.float32)
        buf = torch.from_numpy(arr).view(x.shape).to(x.device)
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, buf, x.numel(), BLOCK=1024)
        buf.untyped_storage().share_memory_()  # the sampled storage moves; `arr` keeps the old memory
        out = torch.from_numpy(arr).view(x.shape)
        out.clamp_min_(0.0)
        return out
