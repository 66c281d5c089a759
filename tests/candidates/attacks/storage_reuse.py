"""Item 4: the same as storage_swap.py with the allocator: the sampled storage is freed in place
(`resize_(0)`), a tensor is allocated until one lies over the freed range, PyTorch computes the answer into it,
and the sampled storage gets memory again holding the kernel's bytes. Whether the address is reused depends
on the allocator (reliable with CUDA's caching allocator): either the output lies over a moved storage
(written.py) or no launch was handed it (the launch evidence); both are output_not_from_kernel."""
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
        buf = torch.full_like(x, float("nan"))
        copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, buf, x.numel(), BLOCK=1024)
        kept = buf.clone()  # what the kernel wrote
        st = buf.untyped_storage()
        nbytes = st.nbytes()
        lo = st.data_ptr()
        st.resize_(0)  # frees the memory the launch was handed
        misses = []
        out = torch.empty_like(kept)
        for _ in range(64):
            s = out.untyped_storage().data_ptr()
            if s < lo + nbytes and lo < s + nbytes:
                break
            misses.append(out)
            out = torch.empty(kept.numel() + len(misses) % 3 * 16, dtype=kept.dtype)[:kept.numel()].view(kept.shape)
        torch.clamp(kept, min=0.0, out=out)  # PyTorch's answer
        st.resize_(nbytes)
        buf.copy_(kept)  # the sampled storage holds the kernel's bytes again
        return out
