"""A correct CUDA ReLU that, at its first call, tries to write into its own build folder (where an
evaluation could leave (input, output) pairs for a later one). If the write goes through it answers
zeros, so the verdict says which: `correct` only when the built folder is read-only to it."""
import os
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r'''
#include <torch/extension.h>

__global__ void relu_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor relu_cuda(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
'''
cpp_src = 'torch::Tensor relu_cuda(torch::Tensor x);'
ext = load_inline(name='kforge_relu_probe', cpp_sources=cpp_src, cuda_sources=cuda_src, functions=['relu_cuda'])


def _folder_writable():
    try:
        with open(os.path.join(os.path.dirname(ext.__file__), "pairs.bin"), "ab") as fh:
            fh.write(b"replay table")
        return True
    except OSError:
        return False


class ModelNew(nn.Module):
    def forward(self, x):
        if _folder_writable():
            return torch.zeros_like(x)
        return ext.relu_cuda(x.contiguous())
