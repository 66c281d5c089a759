"""A checkpoint folder: its layout, checkpoints/step_NNNNNN/{learner/, trainer_state.json} (known only here
and in RunFolder, which writes it), and whether it can be used.

Every file is checked by its format, reading headers and directories, never the weights (`runs ls` asks
for every run): JSON parses, a safetensors file is as long as its header says, a torch file's zip
directory is complete and every member lies inside the file. What a header cannot show (bytes flipped
inside the weights) is caught when the file is loaded; the loaders then name the file too.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any

CHECKPOINTS_DIR = "checkpoints"
CKPT_PREFIX = "step_"
TRAINER_STATE = "trainer_state.json"
LEARNER_DIR = "learner"
# PEFT's names for an adapter folder's files.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
ADAPTER_WEIGHTS_BIN = "adapter_model.bin"  # older PEFT
TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def file_damage(path: Path) -> str | None:
    """Why this file cannot be what its name says, or None."""
    path = Path(path)
    try:
        size = path.stat().st_size
        if size == 0:
            return "is empty"
        if path.suffix == ".json":
            json.loads(path.read_bytes())
        elif path.suffix == ".safetensors":
            return _safetensors_damage(path, size)
        elif path.suffix in TORCH_SUFFIXES:
            return _torch_damage(path, size)
    except (OSError, ValueError) as exc:
        return f"cannot be read ({type(exc).__name__})"
    return None


def _safetensors_damage(path: Path, size: int) -> str | None:
    with open(path, "rb") as fh:
        head = fh.read(8)
        length = int.from_bytes(head, "little") if len(head) == 8 else size
        if length > size - 8:
            return f"is truncated ({size} bytes, shorter than its own header)"
        header = json.loads(fh.read(length))
    if not isinstance(header, dict):
        return "has no safetensors header"
    end = max((entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"), default=0)
    if 8 + length + end != size:
        return f"is truncated ({size} bytes, its header says {8 + length + end})"
    return None


def _torch_damage(path: Path, size: int) -> str | None:
    with open(path, "rb") as fh:
        if path.suffix == ".bin" and fh.read(4) != b"PK\x03\x04":
            return None  # torch's legacy pickle format (old PEFT adapters): no directory to check
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.infolist():
                if member.header_offset + member.compress_size > size:
                    return f"is truncated (member {member.filename} runs past the end)"
    except zipfile.BadZipFile:
        return "is truncated or not a torch file (its zip directory is missing)"
    return None


def checkpoint_step(ckpt: Path) -> int | None:
    """The step a checkpoint folder holds: from its trainer state, else from its name."""
    try:
        return int(json.loads((ckpt / TRAINER_STATE).read_text())["step"])
    except (OSError, KeyError, ValueError, json.JSONDecodeError):
        pass
    if ckpt.name.startswith(CKPT_PREFIX) and ckpt.name[len(CKPT_PREFIX):].isdigit():
        return int(ckpt.name[len(CKPT_PREFIX):])
    return None


def checkpoint_damage(ckpt: Path) -> str | None:
    """Why a checkpoint folder cannot be used, naming the file, or None: every file in it is checked by its
    format, and an adapter config needs its weights beside it."""
    ckpt = Path(ckpt)
    state = ckpt / TRAINER_STATE
    try:
        data = json.loads(state.read_text())
        if not isinstance(data, dict) or "step" not in data:
            return f"{state} holds no step"
    except FileNotFoundError:
        pass  # older layouts and hand-made folders: the learner folder alone is resumable
    except (OSError, ValueError) as exc:
        return f"{state} is damaged ({type(exc).__name__})"
    for path in sorted(ckpt.rglob("*")):
        if any(part.startswith(".") for part in path.relative_to(ckpt).parts):
            continue  # a temp file of an interrupted write, never read
        if path.is_file():
            why = file_damage(path)
            if why:
                return f"{path} is damaged: it {why}"
        weights = (path.parent / ADAPTER_WEIGHTS, path.parent / ADAPTER_WEIGHTS_BIN)
        if path.name == ADAPTER_CONFIG and not any(w.is_file() for w in weights):
            return f"{weights[0]} is missing beside {path.name}"
    return None


def read_trainer_state(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / TRAINER_STATE).read_text())
