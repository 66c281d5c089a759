"""Where kforge keeps what it can rebuild: converted models, reference outputs, baselines, CUDA builds."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """`$KFORGE_CACHE_DIR`, else `~/.cache/kforge`."""
    return Path(os.environ.get("KFORGE_CACHE_DIR") or Path.home() / ".cache" / "kforge")
