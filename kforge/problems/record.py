"""The Problem record: one KernelBench-format task."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

# KernelBench level 4 names the hub model its reference loads as `model_name = "gpt2"` at module level.
_HUB_MODEL = re.compile(r"""^model_name\s*=\s*["']([^"']+)["']""", re.MULTILINE)


@dataclass(frozen=True)
class Problem:
    """A module source defining `class Model(nn.Module)`, `get_inputs()` and `get_init_inputs()`.

    `key` ("LEVEL/ID") is how users and run folders name a problem; `source` says where it came from
    (builtin, jsonl:<path>, kernelbench:<root>, hf:<dataset>).
    """

    level: int
    problem_id: int
    name: str
    code: str
    source: str = "builtin"
    # The built-in suite keeps a correct Triton solution beside each problem (examples and tests).
    solution: str | None = None
    # A source may declare each problem's split ("train" or "test"): `kforge problems generate` holds out
    # structures, not a random share, and every command then reads the split from the rows.
    split: str | None = None

    @property
    def key(self) -> str:
        return f"{self.level}/{self.problem_id}"

    @property
    def hub_models(self) -> tuple[str, ...]:
        """Hugging Face models the reference downloads when it runs (KernelBench level 4); () for most.

        Such a problem cannot run on a machine that has neither the network nor the models cached.
        """
        if "from_pretrained" not in self.code:
            return ()
        return tuple(dict.fromkeys(_HUB_MODEL.findall(self.code))) or ("(a model named in its code)",)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Problem":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
