"""The text of one elementwise problem: its KernelBench-layout reference (`Model`, `get_inputs`,
`get_init_inputs`) and its solution (`ModelNew` around one `@triton.jit` kernel computing the same
expression, a row kernel with tl.sum / tl.max when the root reduces the last dimension)."""

from __future__ import annotations

from kforge.problems.generate.expr import VARS, Node, torch_text, triton_lines

_REDUCE_TEXT = {"sum": "torch.sum({}, dim=-1)", "amax": "torch.amax({}, dim=-1)"}
_REDUCE_SAY = {"sum": " and sums each row over the last dimension", "amax": " and takes each row's maximum"}


def expression(node: Node, reduce: str | None) -> str:
    """The reference's forward as one torch expression."""
    text = torch_text(node)
    return _REDUCE_TEXT[reduce].format(text) if reduce else text


def reference(node: Node, n_inputs: int, reduce: str | None, rows: int, cols: int) -> str:
    names = VARS[:n_inputs]
    params = ", ".join(f"{n}: torch.Tensor" for n in names)
    draws = "".join(f"    {n} = torch.randn(batch_size, dim)\n" for n in names)
    shape = "(batch_size,)" if reduce else "(batch_size, dim)"
    return f'''import torch
import torch.nn as nn


class Model(nn.Module):
    """
    Applies one elementwise expression to its inputs{_REDUCE_SAY.get(reduce or "", "")}.
    """

    def __init__(self):
        super(Model, self).__init__()

    def forward(self, {params}) -> torch.Tensor:
        """
        Returns:
            torch.Tensor: shape {shape}.
        """
        return {expression(node, reduce)}


batch_size = {rows}
dim = {cols}


def get_inputs():
{draws}    return [{", ".join(names)}]


def get_init_inputs():
    return []
'''


def solution(node: Node, n_inputs: int, reduce: str | None) -> str:
    return _row_solution(node, n_inputs, reduce) if reduce else _flat_solution(node, n_inputs)


def _header() -> str:
    return "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"


def _body(node: Node, indent: str) -> tuple[str, str]:
    lines, result = triton_lines(node)
    return "".join(f"{indent}{line}\n" for line in lines), result


def _flat_solution(node: Node, n_inputs: int) -> str:
    names = VARS[:n_inputs]
    ptrs = ", ".join(f"{n}_ptr" for n in names)
    loads = "".join(f"    {n} = tl.load({n}_ptr + offsets, mask=mask)\n" for n in names)
    body, result = _body(node, "    ")
    params = ", ".join(f"{n}: torch.Tensor" for n in names)
    contiguous = "".join(f"        {n} = {n}.contiguous()\n" for n in names)
    return f'''{_header()}@triton.jit
def fused_kernel({ptrs}, out_ptr, n_elements, BLOCK_SIZE: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    mask = offsets < n_elements
{loads}{body}    tl.store(out_ptr + offsets, {result}, mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}) -> torch.Tensor:
{contiguous}        out = torch.empty_like(x)
        n_elements = x.numel()
        BLOCK_SIZE = 1024
        grid = (triton.cdiv(n_elements, BLOCK_SIZE),)
        fused_kernel[grid]({", ".join(names)}, out, n_elements, BLOCK_SIZE=BLOCK_SIZE)
        return out
'''


def _row_solution(node: Node, n_inputs: int, reduce: str) -> str:
    names = VARS[:n_inputs]
    ptrs = ", ".join(f"{n}_ptr" for n in names)
    loads = "".join(f"        {n} = tl.load({n}_ptr + row * n_cols + cols, mask=mask, other=0.0)\n" for n in names)
    body, result = _body(node, "        ")
    params = ", ".join(f"{n}: torch.Tensor" for n in names)
    contiguous = "".join(f"        {n} = {n}.contiguous()\n" for n in names)
    if reduce == "sum":
        start = "acc = tl.zeros((BLOCK_SIZE,), dtype=tl.float32)"
        step = f"acc += tl.where(mask, {result}, 0.0)"
        end = "tl.sum(acc, axis=0)"
    else:
        start = 'acc = tl.full((BLOCK_SIZE,), -float("inf"), dtype=tl.float32)'
        step = f'acc = tl.maximum(acc, tl.where(mask, {result}, -float("inf")))'
        end = "tl.max(acc, axis=0)"
    return f'''{_header()}@triton.jit
def fused_row_kernel({ptrs}, out_ptr, n_cols, BLOCK_SIZE: tl.constexpr):
    # One program per row; the row is walked in BLOCK_SIZE chunks, the padding masked out of the reduction.
    row = tl.program_id(0)
    {start}
    for start in range(0, n_cols, BLOCK_SIZE):
        cols = start + tl.arange(0, BLOCK_SIZE)
        mask = cols < n_cols
{loads}{body}        {step}
    tl.store(out_ptr + row, {end})


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {params}) -> torch.Tensor:
{contiguous}        n_rows, n_cols = x.shape
        out = torch.empty(n_rows, device=x.device, dtype=x.dtype)
        fused_row_kernel[(n_rows,)]({", ".join(names)}, out, n_cols, BLOCK_SIZE=1024)
        return out
'''
