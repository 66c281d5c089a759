"""The one error type of the RAG package."""

from __future__ import annotations

from kforge.errors import UserError


class RagError(UserError):
    """A corpus, index or embedder problem; the message is one line: what, where, and what to do."""
