import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def row_sum_kernel(x_ptr, out_ptr, n_cols, stride_row, BLOCK_SIZE: tl.constexpr):
    # One program per row; the row is walked in BLOCK_SIZE chunks so any length works.
    row = tl.program_id(0)
    acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
        acc += tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Bring the reduced dimension last and view the rest as rows.
        moved = x.movedim(self.dim, -1).contiguous()
        out_shape = moved.shape[:-1]
        n_cols = moved.shape[-1]
        rows = moved.reshape(-1, n_cols)
        out = torch.empty(rows.shape[0], device=x.device, dtype=x.dtype)
        row_sum_kernel[(rows.shape[0],)](rows, out, n_cols, rows.stride(0), BLOCK_SIZE=256)
        return out.reshape(out_shape)
