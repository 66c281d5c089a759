"""Atomic folder writes and the random-number-generator state of a learner checkpoint.

A checkpoint folder is written completely under a temporary name beside its destination and then
renamed into place. If the destination already exists it is first renamed to ``NAME.old`` and removed
only after the new folder is in place, so a crash at any moment leaves either the old or the new
checkpoint complete (``resolve_checkpoint`` finds ``NAME.old`` when the crash hit between renames).
"""

from __future__ import annotations

import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch


@contextmanager
def atomic_folder(path: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces ``path``; on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = path.parent / f"{path.name}.old"
    if path.exists():
        if old.exists():
            shutil.rmtree(old)
        os.rename(path, old)
    os.rename(tmp, path)
    _fsync_dir(path.parent)
    if old.exists():
        shutil.rmtree(old)


STATE_FILE = "trainer_state.pt"  # optimizer, scheduler, RNG states and counters, beside adapter/


def read_state(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A learner checkpoint's folder and the state `STATE_FILE` holds (LearnerError: not a learner checkpoint)."""
    from kforge.learner.lora import LearnerError

    folder = resolve_checkpoint(path)
    if not (folder / STATE_FILE).is_file():
        raise LearnerError(f"checkpoint {path}: no {STATE_FILE} there; is it a learner checkpoint folder?")
    return folder, torch.load(folder / STATE_FILE, map_location="cpu", weights_only=False)


def resolve_checkpoint(path: str | Path) -> Path:
    """``path``, or its ``.old`` twin when a crash interrupted the swap."""
    path = Path(path)
    old = path.parent / f"{path.name}.old"
    if not path.exists() and old.exists():
        return old
    return path


def _fsync_tree(folder: Path) -> None:
    for file in folder.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np

        state["numpy"] = np.random.get_state()
    except ImportError:
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        np.random.set_state(state["numpy"])
