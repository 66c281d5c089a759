"""The index on disk: a FAISS inner-product index over unit vectors, the entries beside it, a manifest.

A folder holds three files:

- ``index.faiss``: exact ``IndexFlatIP`` (or ``IndexHNSWFlat`` with inner product above
  `HNSW_THRESHOLD` entries, or when asked); vectors are L2-normalised, so scores are cosine similarities;
- ``entries.jsonl``: one corpus entry per line, in index order;
- ``manifest.json`` (`kforge.rag.manifest`): written last. A folder without a manifest is not an index.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kforge.rag.corpus import CorpusEntry
from kforge.rag.embed import _require
from kforge.rag.errors import RagError
from kforge.rag.manifest import MANIFEST_FILE, read_manifest, write_manifest

if TYPE_CHECKING:
    import faiss

INDEX_FILE = "index.faiss"
ENTRIES_FILE = "entries.jsonl"
# Exact search over N x 384 floats stays under a few milliseconds per query up to about this size;
# past it, HNSW keeps queries fast at a small cost in recall.
HNSW_THRESHOLD = 100_000
HNSW_M = 32
HNSW_EF_CONSTRUCTION = 200
HNSW_EF_SEARCH = 128


def make_index(vectors: np.ndarray, hnsw: bool | None = None) -> faiss.Index:
    """A FAISS index holding `vectors` (unit rows): flat inner product, or HNSW when asked or large."""
    faiss = _require("faiss", "the RAG index")
    dim = int(vectors.shape[1])
    use_hnsw = hnsw if hnsw is not None else len(vectors) > HNSW_THRESHOLD
    if use_hnsw:
        index = faiss.IndexHNSWFlat(dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = HNSW_EF_CONSTRUCTION
        index.hnsw.efSearch = HNSW_EF_SEARCH
    else:
        index = faiss.IndexFlatIP(dim)
    if len(vectors):
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def index_type(index: faiss.Index) -> str:
    return "hnsw" if hasattr(index, "hnsw") else "flat"


def save_index(out_dir: Path, index: faiss.Index, entries: list[CorpusEntry], manifest: dict[str, Any]) -> None:
    """Write the three files; each goes to a temporary name first and the manifest is replaced last, so a
    crash never leaves a manifest that describes files it does not match."""
    faiss = _require("faiss", "the RAG index")
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f".tmp{os.getpid()}"
    stale_manifest = out_dir / MANIFEST_FILE
    if stale_manifest.exists():
        stale_manifest.unlink()  # the old manifest must not outlive the files it described
    index_tmp = out_dir / (INDEX_FILE + tag)
    faiss.write_index(index, str(index_tmp))
    os.replace(index_tmp, out_dir / INDEX_FILE)
    entries_tmp = out_dir / (ENTRIES_FILE + tag)
    with entries_tmp.open("w", encoding="utf-8") as handle:
        for entry in entries:
            handle.write(json.dumps(entry.to_dict(), ensure_ascii=False) + "\n")
    os.replace(entries_tmp, out_dir / ENTRIES_FILE)
    write_manifest(out_dir, manifest)


@dataclass
class StoredIndex:
    folder: Path
    manifest: dict[str, Any]
    index: faiss.Index
    entries: list[CorpusEntry]

    @property
    def backend(self) -> str:
        return str(self.manifest.get("backend"))

    @property
    def dim(self) -> int:
        return int(self.manifest["embedder"]["dim"])


def load_index(folder: Path) -> StoredIndex:
    faiss = _require("faiss", "the RAG index")
    manifest = read_manifest(folder)
    for name in (INDEX_FILE, ENTRIES_FILE):
        if not (folder / name).is_file():
            raise RagError(f"index at {folder} lacks {name}: rebuild it with `kforge rag build --out {folder}`")
    try:
        index = faiss.read_index(str(folder / INDEX_FILE))
    except RuntimeError as exc:
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else "unreadable"
        raise RagError(f"{folder / INDEX_FILE} is not a FAISS index ({reason}): rebuild it") from None
    entries: list[CorpusEntry] = []
    with (folder / ENTRIES_FILE).open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                entries.append(CorpusEntry.from_dict(json.loads(line)))
    count = manifest.get("count")
    if not (index.ntotal == len(entries) == count):
        raise RagError(
            f"index at {folder} is inconsistent ({index.ntotal} vectors, {len(entries)} entries, manifest says "
            f"{count}): rebuild it with `kforge rag build`"
        )
    if index.d != int(manifest["embedder"]["dim"]):
        raise RagError(
            f"index at {folder} has {index.d}-dimensional vectors but its manifest says "
            f"{manifest['embedder']['dim']}: rebuild it with `kforge rag build`"
        )
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = max(int(index.hnsw.efSearch), HNSW_EF_SEARCH)
    return StoredIndex(folder, manifest, index, entries)
