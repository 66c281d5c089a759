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

from kforge.space import refused_write


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
    except BaseException as exc:
        # safetensors and torch report a full disk in their own exception types: an OSError naming the
        # folder instead, found before the temp folder gives its room back.
        refused = refused_write(exc, path.parent) if isinstance(exc, Exception) else None
        shutil.rmtree(tmp, ignore_errors=True)
        if refused is not None:
            raise refused from exc
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


# Optimizer, scheduler, RNG states and counters, beside adapter/: tensors, numbers, strings and containers
# only, so that it loads with weights_only=True (a run folder may be shared: nothing in it is unpickled).
STATE_FILE = "trainer_state.pt"


def read_state(path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A learner checkpoint's folder and the state `STATE_FILE` holds; LearnerError naming the file when
    it is missing, damaged or holds anything but plain data."""
    from kforge.learner.lora import LearnerError

    folder = resolve_checkpoint(path)
    file = folder / STATE_FILE
    if not file.is_file():
        raise LearnerError(f"checkpoint {path}: no {STATE_FILE} there; is it a learner checkpoint folder?")
    try:
        state = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises many kinds here: a short zip, a refused global, a bad pickle
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise LearnerError(f"{file} cannot be loaded as plain data ({type(exc).__name__}: {first}); "
                           "it is damaged or was not written by this kforge") from None
    if not isinstance(state, dict):
        raise LearnerError(f"{file} holds no learner state")
    return folder, state


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

        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = {"name": name, "keys": torch.from_numpy(keys.astype("int64")), "pos": int(pos),
                          "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}
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

        saved = state["numpy"]
        np.random.set_state((saved["name"], saved["keys"].numpy().astype("uint32"), saved["pos"],
                             saved["has_gauss"], saved["cached_gaussian"]))
