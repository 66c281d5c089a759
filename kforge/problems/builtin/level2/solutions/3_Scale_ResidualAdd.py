import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def scale_residual_kernel(x_ptr, r_ptr, out_ptr, scaling_factor, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
    x = tl.load(x_ptr + offsets, mask=mask)
    r = tl.load(r_ptr + offsets, mask=mask)
    tl.store(out_ptr + offsets, x * scaling_factor + r, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, scaling_factor: float):
        super().__init__()
        self.scaling_factor = scaling_factor

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        residual = residual.contiguous()
        out = torch.empty_like(x)
        n_elements = x.numel()
        BLOCK_SIZE = 1024
        grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
        scale_residual_kernel[grid](x, residual, out, self.scaling_factor, n_elements, BLOCK_SIZE=BLOCK_SIZE)
        return out
