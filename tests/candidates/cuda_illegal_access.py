"""A CUDA kernel that writes far out of bounds."""
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r'''
#include <torch/extension.h>

__global__ void bad_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i * 100000000LL] = x[i];
}

torch::Tensor bad_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    bad_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
'''
cpp_src = 'torch::Tensor bad_cuda(torch::Tensor x);'
ext = load_inline(name='kforge_bad', cpp_sources=cpp_src, cuda_sources=cuda_src, functions=['bad_cuda'])


class ModelNew(nn.Module):
    def forward(self, x):
        return ext.bad_cuda(x.contiguous())
