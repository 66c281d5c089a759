"""The static check resolves a candidate's renames of what it imported (static/aliases.py): a store through
any name that stands for a library is the patch it is; honest renames (`F = torch.nn.functional`) are
resolved, not refused."""

from __future__ import annotations

from kforge.evaluator.static.aliases import import_aliases
from kforge.evaluator.static.static_check import check_source, parse

RELU_REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""

HEAD = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        k[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
"""


def test_renames_resolve_at_any_depth_and_in_any_order():
    tree = parse("def f():\n    b.equal = g\nb = a\na = torch\nF = torch.nn.functional\nimport torch\n"
                 "(c := triton)\nimport triton\nd: object = tl\nimport triton.language as tl\nx = y\n")
    aliases = import_aliases(tree)
    assert aliases["a"] == aliases["b"] == "torch" and aliases["F"] == "torch.nn.functional"
    assert aliases["c"] == "triton" and aliases["d"] == "triton.language" and "x" not in aliases


def test_a_store_through_a_rename_is_a_patch_and_an_honest_rename_is_not():
    for patch in ("t = torch\nt.frombuffer = print\n", "t = torch\nu = t\nu.equal = print\n",
                  "c = torch.cuda\ndel c.synchronize\n"):
        errors = check_source(HEAD + patch, RELU_REF, "triton").errors
        assert any("patching a library" in e for e in errors), (patch, errors)
    honest = HEAD.replace("        return y\n", "        return F.relu(y) if False else y\n") + "F = torch.nn.functional\n"
    report = check_source(honest, RELU_REF, "triton")
    assert report.errors == [] and "pytorch_op:relu" in report.flags  # the rename resolves to the op it names
