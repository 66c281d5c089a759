"""The output folder of `kforge problems generate`: written only when it is new, empty, or one this command
wrote before (its manifest says so and nothing else is in it), each file whole or not at all."""

from __future__ import annotations

import json
from pathlib import Path

from kforge.problems.generate.family import MANIFEST_KIND, GenerateError
from kforge.space import atomic_write_text, check_writable

MANIFEST = "curriculum.json"


def written_by_us(folder: Path, names: set[str]) -> bool:
    """The folder holds only files of these names, and a manifest this command wrote."""
    present = {p.name for p in folder.iterdir()}
    if not present:
        return True
    if MANIFEST not in present or not present <= names:
        return False
    try:
        return json.loads((folder / MANIFEST).read_text(encoding="utf-8")).get("kind") == MANIFEST_KIND
    except (OSError, ValueError, AttributeError):
        return False


def write(folder: Path, texts: dict[str, str]) -> None:
    """Write `texts` (file name -> text) into `folder`, manifest first (a folder cut short by a crash is
    still one this command may write again)."""
    if folder.exists() and not folder.is_dir():
        raise GenerateError(f"--out {folder} is a file: give a new or empty folder")
    if folder.is_dir() and not written_by_us(folder, set(texts)):
        raise GenerateError(f"--out {folder} holds files `kforge problems generate` did not write: "
                            "give a new or empty folder")
    check_writable(folder, "--out")
    folder.mkdir(parents=True, exist_ok=True)
    for name in sorted(texts, key=lambda n: n != MANIFEST):
        atomic_write_text(folder / name, texts[name])


def read_manifest(folder: Path) -> dict:
    """The manifest of a folder this command wrote (for tools that read the split or structures back)."""
    path = folder / MANIFEST
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise GenerateError(f"{path}: not a readable manifest ({exc}); generate the folder again") from None
    if not isinstance(doc, dict) or doc.get("kind") != MANIFEST_KIND:
        raise GenerateError(f"{path}: not a manifest of `kforge problems generate`")
    return doc
