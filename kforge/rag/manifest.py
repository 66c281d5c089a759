"""An index folder's manifest.json: its one writer and its readers.

Written last by `save_index` (after the vectors and entries it describes), in one piece: the embedder
(name, location, dimension), the backend, the index type, each corpus with its content hash and counts,
what was dropped and why, and the leak guard (the problems it protects and whose held-out set they are).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kforge.rag.errors import RagError
from kforge.space import atomic_write_text

MANIFEST_FILE = "manifest.json"
FORMAT_VERSION = 1


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Replace the manifest atomically: a reader sees the old one or the new one, never half of either."""
    atomic_write_text(folder / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")


def read_raw(folder: Path) -> dict[str, Any]:
    """The manifest as written, its format unchecked (the leak guard is read from any index that has one)."""
    path = folder / MANIFEST_FILE
    if not path.is_file():
        hint = "the folder does not exist" if not folder.exists() else f"{MANIFEST_FILE} is missing"
        raise RagError(
            f"no RAG index at {folder} ({hint}): build one with `kforge rag build --out {folder}`"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RagError(f"{path} is not valid JSON ({exc}): rebuild the index with `kforge rag build`") from None
    return manifest if isinstance(manifest, dict) else {}


def read_manifest(folder: Path, raw: dict[str, Any] | None = None) -> dict[str, Any]:
    """The manifest of an index this kforge can use; `raw`: what `read_raw` gave a caller that read it already."""
    manifest = read_raw(folder) if raw is None else raw
    embedder = manifest.get("embedder")
    if manifest.get("format_version") != FORMAT_VERSION or not isinstance(embedder, dict) \
            or not isinstance(embedder.get("dim"), int) or not embedder.get("name"):
        found = manifest.get("format_version")
        raise RagError(
            f"{folder / MANIFEST_FILE} has index format {found!r}, this kforge reads {FORMAT_VERSION}: "
            "rebuild it with `kforge rag build`"
        )
    return manifest


def embedder_of(manifest: dict[str, Any]) -> tuple[str, int]:
    """The embedder's name and vector dimension."""
    return str(manifest["embedder"]["name"]), int(manifest["embedder"]["dim"])


def leak_guard(raw: dict[str, Any]) -> dict[str, Any] | None:
    """The leak guard's record (`protected` problem keys, `held_out_of`) in a manifest `read_raw` read, or None
    for an index built before the guard recorded anything."""
    guard = raw.get("leak_guard")
    return guard if isinstance(guard, dict) else None
