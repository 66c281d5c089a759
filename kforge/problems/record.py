"""The Problem record: one KernelBench-format task."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


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

    @property
    def key(self) -> str:
        return f"{self.level}/{self.problem_id}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Problem":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
