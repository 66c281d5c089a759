"""KernelBench level-1 candidates written for the judge's benches: correct Triton kernels for 18 problems
(matmuls with any strides, reductions over a dimension, matrix-vector, diagonal, GELU, three losses), the
6.4 GB-input ones of `--big`, six broken or hacking ones that must not pass, and the shrinking of a problem's
shapes for a CPU dry run. Used by bench.eval_throughput, bench.judge_latency, bench.repeatability,
bench.timing_fidelity and bench.write_candidates.
"""

from __future__ import annotations

import re

HEAD = '''import torch
import torch.nn as nn
import triton
import triton.language as tl
'''

# --- matmul with arbitrary strides (transposes are views); ieee fp32 so 1e-4 tolerances hold -----
MATMUL = HEAD + '''

@triton.jit
def mm_kernel(a, b, c, M, N, K, sam, sak, sbk, sbn, scm, scn,
              BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, PREC: tl.constexpr):
    pm = tl.program_id(0)
    pn = tl.program_id(1)
    rm = pm * BM + tl.arange(0, BM)
    rn = pn * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ka = k0 + rk
        x = tl.load(a + rm[:, None] * sam + ka[None, :] * sak, mask=(rm[:, None] < M) & (ka[None, :] < K), other=0.0)
        y = tl.load(b + ka[:, None] * sbk + rn[None, :] * sbn, mask=(ka[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(x, y, input_precision=PREC)
    tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def mm(a, b, prec="ieee"):
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty((M, N), device=a.device, dtype=torch.float32)
    grid = (triton.cdiv(M, 64), triton.cdiv(N, 64))
    mm_kernel[grid](a, b, c, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
                    BM=64, BN=64, BK=32, PREC=prec)
    return c


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        return mm(__A__, __B__)
'''

# --- reductions over dim 1 of a (B, R, C) tensor ----------------------------------------------------
REDUCE = HEAD + '''

@triton.jit
def reduce_kernel(x, out, R, C, sxb, sxr, sxc, BC: tl.constexpr, OP: tl.constexpr):
    b = tl.program_id(0)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    cmask = cols < C
    base = x + b * sxb + cols * sxc
    if OP == 0 or OP == 1:
        acc = tl.zeros((BC,), dtype=tl.float32)
    elif OP == 2 or OP == 4:
        acc = tl.full((BC,), float("-inf"), dtype=tl.float32)
    else:
        acc = tl.full((BC,), float("inf"), dtype=tl.float32)
    idx = tl.zeros((BC,), dtype=tl.int64)
    for r in range(0, R):
        v = tl.load(base + r * sxr, mask=cmask, other=0.0)
        if OP == 0 or OP == 1:
            acc += v
        elif OP == 2 or OP == 4:
            better = v > acc
            idx = tl.where(better, r, idx)
            acc = tl.where(better, v, acc)
        else:
            better = v < acc
            idx = tl.where(better, r, idx)
            acc = tl.where(better, v, acc)
    if OP == 1:
        acc = acc / R
    if OP == 4 or OP == 5:
        tl.store(out + b * C + cols, idx, mask=cmask)
    else:
        tl.store(out + b * C + cols, acc, mask=cmask)


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        B, R, C = x.shape
        dtype = torch.int64 if __OP__ >= 4 else x.dtype
        out = torch.empty((B, C), device=x.device, dtype=dtype)
        reduce_kernel[(B, triton.cdiv(C, 128))](x, out, R, C, x.stride(0), x.stride(1), x.stride(2), BC=128, OP=__OP__)
        return __RET__
'''

MATVEC = HEAD + '''

@triton.jit
def matvec_kernel(a, v, out, K, sam, BK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros((BK,), dtype=tl.float32)
    for k0 in range(0, K, BK):
        ks = k0 + tl.arange(0, BK)
        m = ks < K
        acc += tl.load(a + row * sam + ks, mask=m, other=0.0) * tl.load(v + ks, mask=m, other=0.0)
    tl.store(out + row, tl.sum(acc, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        M, K = A.shape
        out = torch.empty((M, 1), device=A.device, dtype=A.dtype)
        matvec_kernel[(M,)](A, B.contiguous(), out, K, A.stride(0), BK=4096)
        return out
'''

DIAG = HEAD + '''

@triton.jit
def diag_kernel(a, b, c, N, M, BM: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.program_id(1) * BM + tl.arange(0, BM)
    m = cols < M
    s = tl.load(a + row)
    tl.store(c + row * M + cols, s * tl.load(b + row * M + cols, mask=m, other=0.0), mask=m)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A, B):
        N, M = B.shape
        B = B.contiguous()
        C = torch.empty_like(B)
        diag_kernel[(N, triton.cdiv(M, 1024))](A, B, C, N, M, BM=1024)
        return C
'''

GELU = HEAD + '''

@triton.jit
def gelu_kernel(x, y, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    v = tl.load(x + offs, mask=m)
    inner = 0.7978845608028654 * (v + 0.044715 * v * v * v)
    t = 2.0 / (1.0 + tl.exp(-2.0 * inner)) - 1.0
    tl.store(y + offs, 0.5 * v * (1.0 + t), mask=m)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        gelu_kernel[(triton.cdiv(x.numel(), 4096),)](x, y, x.numel(), BLOCK=4096)
        return y
'''

LOSS = HEAD + '''

@triton.jit
def loss_kernel(p, t, out, n, cols, BLOCK: tl.constexpr, OP: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    a = tl.load(p + offs, mask=m, other=0.0)
    if OP == 2:
        b = tl.load(t + offs % cols, mask=m, other=0.0)
        v = tl.maximum(1.0 - a * b, 0.0)
    else:
        b = tl.load(t + offs, mask=m, other=0.0)
        d = a - b
        if OP == 0:
            v = d * d
        else:
            ad = tl.abs(d)
            v = tl.where(ad < 1.0, 0.5 * d * d, ad - 0.5)
    v = tl.where(m, v, 0.0)
    tl.atomic_add(out, tl.sum(v, axis=0))


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        p = predictions.contiguous()
        t = targets.contiguous()
        acc = torch.zeros((), device=p.device, dtype=torch.float32)
        loss_kernel[(triton.cdiv(p.numel(), 8192),)](p, t, acc, p.numel(), p.shape[-1], BLOCK=8192, OP=__OP__)
        return acc / p.numel()
'''


# --- elementwise ops on KernelBench's 4096 x 393216 inputs (6.4 GB per tensor) ---------------------
ELEMENTWISE = HEAD + '''

@triton.jit
def ew_kernel(x_ptr, y_ptr, n, slope, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, __EXPR__, mask=mask)


class ModelNew(nn.Module):
    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.slope = negative_slope

    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        n = x.numel()
        ew_kernel[(triton.cdiv(n, 4096),)](x, y, n, self.slope, BLOCK=4096)
        return y
'''

# --- softmax over rows of 393216 values: one program per row, two passes (online max and sum) -------
SOFTMAX = HEAD + '''

@triton.jit
def softmax_kernel(x_ptr, y_ptr, cols, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    base = row * cols
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), tl.float32)
    for c0 in range(0, cols, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < cols, other=float("-inf"))
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.where(offs < cols, tl.exp(x - m_new), 0.0)
        m = m_new
    mx = tl.max(m, 0)
    total = tl.sum(s * tl.exp(m - mx), 0)
    for c0 in range(0, cols, BLOCK):
        offs = c0 + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + base + offs, mask=offs < cols, other=0.0)
        tl.store(y_ptr + base + offs, tl.exp(x - mx) / total, mask=offs < cols)


class ModelNew(nn.Module):
    def forward(self, x):
        x = x.contiguous()
        y = torch.empty_like(x)
        softmax_kernel[(x.shape[0],)](x, y, x.shape[1], BLOCK=2048)
        return y
'''

BIG = {19: ELEMENTWISE.replace("__EXPR__", "tl.maximum(x, 0.0)"),
       20: ELEMENTWISE.replace("__EXPR__", "tl.where(x > 0, x, x * slope)"),
       21: ELEMENTWISE.replace("__EXPR__", "tl.sigmoid(x)"),
       23: SOFTMAX}


def correct_candidates() -> dict[int, str]:
    mm_args = {1: ("A", "B"), 2: ("A", "B"), 13: ("A", "B"), 16: ("A.T", "B"), 17: ("A", "B.T"), 18: ("A.T", "B.T")}
    out = {pid: MATMUL.replace("__A__", a).replace("__B__", b) for pid, (a, b) in mm_args.items()}
    reduce_ops = {47: (0, "out.unsqueeze(1)"), 48: (1, "out"), 49: (2, "out"), 53: (3, "out"), 51: (4, "out"), 52: (5, "out")}
    for pid, (op, ret) in reduce_ops.items():
        out[pid] = REDUCE.replace("__OP__", str(op)).replace("__RET__", ret)
    out[4] = MATVEC
    out[12] = DIAG
    out[88] = GELU
    out[94] = LOSS.replace("__OP__", "0")
    out[96] = LOSS.replace("__OP__", "1")
    out[100] = LOSS.replace("__OP__", "2")
    return out


def big_candidates() -> dict[int, str]:
    """Outputs of several GB: compared at sampled positions, never moved whole."""
    return dict(BIG)


def broken_candidates() -> list[tuple[int, str, str]]:
    """(problem id, label, code) for candidates that must not pass."""
    tf32 = MATMUL.replace("__A__", "A").replace("__B__", "B").replace('mm(A, B)', 'mm(A, B, "tf32")')
    zeros = REDUCE.replace("__OP__", "0").replace("__RET__", "torch.zeros_like(out).unsqueeze(1)")
    memo = REDUCE.replace("__OP__", "1").replace("__RET__", "out").replace(
        "    def forward(self, x):\n", "    def forward(self, x):\n        if hasattr(self, 'memo'):\n"
        "            return self.memo\n").replace("        return out\n", "        self.memo = out\n        return out\n")
    oob = REDUCE.replace("__OP__", "2").replace("__RET__", "out").replace("base + r * sxr", "base + r * sxr * 4096")
    torch_only = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, A, B):\n" \
                 "        return torch.matmul(A, B)\n"
    syntax = MATVEC.replace("def forward(self, A, B):", "def forward(self, A, B)")
    return [(1, "tf32 matmul", tf32), (47, "returns zeros", zeros), (48, "memoised", memo),
            (49, "out-of-bounds reads", oob), (4, "pure PyTorch", torch_only), (4, "syntax error", syntax)]


def shrink(code: str) -> str:
    """Tiny shapes for a CPU dry run (the Triton interpreter is slow)."""
    small = {"N": "40", "M": "48", "K": "56", "batch_size": "40", "dim1": "16", "dim2": "24"}
    for name, value in small.items():
        code = re.sub(rf"^{name}\s*=.*$", f"{name} = {value}", code, flags=re.M)
    return re.sub(r"^input_shape\s*=.*$", "input_shape = (40,)", code, flags=re.M)
