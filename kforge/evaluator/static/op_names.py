"""One name per PyTorch op, whatever the spelling: `nn.Softmax`, `F.softmax`, `torch.softmax`, `x.softmax_()`.

The PyTorch-op flag compared names as written, so a candidate could call the reference's own op as a module
(`nn.Softmax(dim=-1)(y)` beside `torch.softmax`) or under a documented alias (`clip` for `clamp`). Every name
on both sides is reduced to one key: in-place underscore dropped, case and underscores dropped, the
dimension suffix of modules (`BatchNorm2d`) and the `Loss` of loss modules dropped, and the aliases PyTorch
documents mapped to the op they name. Two names with one key are one op, as far as the flag is concerned.
"""

from __future__ import annotations

import re

# Documented aliases (torch.clip is torch.clamp ...) and module names whose functional form is spelled
# otherwise; keys on both sides are already reduced by `_reduce`.
ALIASES = {
    "clip": "clamp", "absolute": "abs", "multiply": "mul", "divide": "div", "truedivide": "div", "subtract": "sub",
    "negative": "neg", "arccos": "acos", "arcsin": "asin", "arctan": "atan", "arccosh": "acosh",
    "arcsinh": "asinh", "arctanh": "atanh", "arctan2": "atan2", "greater": "gt", "greaterequal": "ge", "less": "lt",
    "lessequal": "le", "notequal": "ne", "expit": "sigmoid", "mm": "matmul", "bmm": "matmul", "mv": "matmul",
    "fix": "trunc", "rsub": "sub", "bce": "binarycrossentropy", "bcewithlogits": "binarycrossentropywithlogits",
    "upsample": "interpolate", "upsamplingnearest": "interpolate", "upsamplingbilinear": "interpolate",
    "softmax2": "softmax", "concatenate": "cat", "concat": "cat", "swapaxes": "transpose", "swapdims": "transpose",
}
_DIMS = re.compile(r"(?<=[a-z])[123]d$")


def _reduce(name: str) -> str:
    key = name.rstrip("_").replace("_", "").lower()
    key = _DIMS.sub("", key)
    if key.endswith("loss") and len(key) > 4:
        key = key[:-4]
    return key


def op_key(name: str) -> str:
    """The one key of an op name (its last dotted part)."""
    key = _reduce(name.rsplit(".", 1)[-1])
    return ALIASES.get(key, key)


def same_op(name: str, reference_keys: set[str]) -> bool:
    """Whether `name` is one of the reference's ops, `reference_keys` made by `op_key`."""
    return bool(name) and op_key(name) in reference_keys
