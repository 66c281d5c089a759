"""Worked examples shown in prompts, and the small interface a retriever implements.

The prompt builder only needs `ExampleRetriever.retrieve`; the RAG package provides the FAISS-backed
implementation, and the built-in suite's reference solutions provide one-shot/few-shot examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from kforge.problems.record import Problem


@dataclass(frozen=True)
class Example:
    name: str
    pytorch_code: str  # the reference module (what a new problem looks like)
    kernel_code: str  # a ModelNew that implements it with a custom kernel
    backend: str = "triton"
    source: str = "builtin"
    score: float | None = None  # retrieval similarity, when retrieved
    problem_key: str | None = None  # "LEVEL/ID" of the problem it solves, when it comes from a problem set


class ExampleRetriever(Protocol):
    def retrieve(self, problem: Problem, k: int) -> list[Example]:
        """The k examples closest to `problem`, never the problem itself."""
        ...
