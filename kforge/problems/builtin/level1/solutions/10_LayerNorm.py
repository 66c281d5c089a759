import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def layer_norm_kernel(x_ptr, w_ptr, b_ptr, out_ptr, n_cols, stride_row, eps, BLOCK_SIZE: tl.constexpr):
    # One program per row; BLOCK_SIZE covers the whole row (next power of two).
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK_SIZE)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * stride_row + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    # Zero the padding lanes so they add nothing to the variance.
    centered = tl.where(mask, x - mean, 0.0)
    var = tl.sum(centered * centered, axis=0) / n_cols
    rstd = 1.0 / tl.sqrt(var + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=mask, other=0.0)
    tl.store(out_ptr + row * stride_row + cols, centered * rstd * w + b, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-5):
        super().__init__()
        self.hidden_size = hidden_size
        self.eps = eps
        # Same names and shapes as the reference, so its weights load here.
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.bias = nn.Parameter(torch.zeros(hidden_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.contiguous().reshape(-1, self.hidden_size)
        out = torch.empty_like(rows)
        BLOCK_SIZE = triton.next_power_of_2(self.hidden_size)
        layer_norm_kernel[(rows.shape[0],)](
            rows, self.weight, self.bias, out, self.hidden_size, rows.stride(0), self.eps, BLOCK_SIZE=BLOCK_SIZE
        )
        return out.reshape(x.shape)
