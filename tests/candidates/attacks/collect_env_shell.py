"""Item 2: a shell through torch's own file. `torch.utils.collect_env.run` calls Popen(shell=True), so the audit
hook sees torch asking; the shell (or a second Python it starts) has no audit hook at all. Every call needs the
shell's answer. Only the seccomp filter applied at READY (no exec, no new process) stops it."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.utils.collect_env import run


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        try:
            rc, out, _ = run("echo 1")
        except OSError as exc:
            raise RuntimeError(f"the shell did not run: {exc}") from None
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=int(out.strip()) * 1024)
        return y
