import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def rms_norm_kernel(x_ptr, w_ptr, out_ptr, n_cols, stride_row, eps, BLOCK_SIZE: tl.constexpr):
    # One program per row; BLOCK_SIZE covers the whole row (next power of two).
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0)
    mean_square = tl.sum(x * x, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(mean_square + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_row + cols, x * rstd * w, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Same name and shape as the reference, so its weight loads here.
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.contiguous().reshape(-1, self.hidden_size)
        out = torch.empty_like(rows)
        BLOCK_SIZE = triton.next_power_of_2(self.hidden_size)
        rms_norm_kernel[(rows.shape[0],)](
            rows, self.weight, out, self.hidden_size, rows.stride(0), self.eps, BLOCK_SIZE=BLOCK_SIZE
        )
        return out.reshape(x.shape)
