"""The one error type of the RAG package."""

from __future__ import annotations


class RagError(ValueError):
    """A corpus, index or embedder problem; the message is one line: what, where, and what to do."""
