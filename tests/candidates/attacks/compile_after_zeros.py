"""Item 6: the first calls (the one made right after READY, whose outputs nobody reads, and the first trial) answer zeros with no kernel at all (a wrong answer, but an answer), then every later
call launches a kernel that does not compile (Triton compiles at the first launch), its failure re-raised as
RuntimeError. Any answered call once showed the parent that the code compiled: `runtime_error`, worth the
compile reward, while the same file without the first answer (compile_fails.py) is `compile_error`."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

_calls = [0]


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.no_such_function(x), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    n = x.numel()
    try:
        relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    except Exception as exc:
        raise RuntimeError("the kernel stopped") from exc
    return y


class ModelNew(nn.Module):
    def forward(self, x):
        _calls[0] += 1
        if _calls[0] <= 2:
            return torch.zeros_like(x)
        return relu(x)
