"""An ordinary-style honest kernel with @triton.autotune (the Triton interpreter on a CPU cannot autotune:
GPU only), a launch-time grid from the chosen config, and `math` constants in the launch arguments."""
import math

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.autotune(configs=[triton.Config({"BLOCK": 256}), triton.Config({"BLOCK": 1024})], key=["n"])
@triton.jit
def gelu_kernel(x_ptr, y_ptr, n, c, k, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    inner = c * (x + k * x * x * x)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    tl.store(y_ptr + offs, 0.5 * x * (1.0 + t), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        flat = x.contiguous().view(-1)
        y = torch.empty_like(flat)
        n = flat.numel()
        gelu_kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](flat, y, n, math.sqrt(2.0 / math.pi), 0.044715)
        return y.view(x.shape)
