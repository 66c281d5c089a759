"""What several benches share: the repository root, where KernelBench's problems are, another checkout's
kforge to measure, and the plain table they print.

Nothing here imports torch, triton or kforge: a bench sets its environment (TRITON_INTERPRET, CUDA
allocator settings) before those imports, and importing this module must not do them first.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parent.parent

# KernelBench's problems as one JSONL file (the fields of `kforge problems` jsonl sources), and the published
# H100 baseline beside it. KFORGE_KERNELBENCH names the file; without it, the data folder shared beside this
# checkout (../shared/data/kernelbench/problems.jsonl).
KERNELBENCH_ENV = "KFORGE_KERNELBENCH"
KERNELBENCH_FALLBACK = Path("shared") / "data" / "kernelbench" / "problems.jsonl"
BASELINE_NAME = "H100_Modal__baseline_time_torch.json"


def kernelbench_jsonl() -> Path:
    """KernelBench's problems.jsonl: $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl
    next to the repository (the file may be absent: callers check, tests skip)."""
    named = os.environ.get(KERNELBENCH_ENV)
    return Path(named).expanduser() if named else REPO.parent / KERNELBENCH_FALLBACK


def kernelbench_baselines() -> Path:
    """The published H100 eager baselines kept with the problems (baselines/ beside problems.jsonl)."""
    return kernelbench_jsonl().parent / "baselines" / BASELINE_NAME


def use_kforge_from(root: str | os.PathLike | None) -> Path:
    """Import the package `kforge` from the checkout `root` (KFORGE_BENCH_ROOT: measure another checkout with
    this one's benches), before anything imports it; None or this repository: the usual import. Returns the
    folder kforge comes from. The judge's zygote finds kforge from the imported package's own file, so its
    children run the same checkout."""
    if root is None or Path(root).resolve() == REPO:
        return REPO
    folder = Path(root).resolve() / "kforge"
    loaded = sys.modules.get("kforge")
    if loaded is not None:
        if Path(loaded.__file__).resolve().parent != folder:
            raise RuntimeError(f"kforge was imported from {Path(loaded.__file__).parent} before {folder} was asked for")
        return folder.parent
    spec = importlib.util.spec_from_file_location("kforge", folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    if spec is None or spec.loader is None:
        raise SystemExit(f"error: no kforge package in {root} (KFORGE_BENCH_ROOT)")
    module = importlib.util.module_from_spec(spec)
    sys.modules["kforge"] = module
    spec.loader.exec_module(module)
    return folder.parent


def kforge_root() -> Path:
    """The checkout the imported kforge comes from."""
    import kforge

    return Path(kforge.__file__).resolve().parent.parent


def print_table(heads: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Columns padded to their widest cell, ` | ` between them and a rule under the heads."""
    widths = [max(len(str(r[i])) for r in [*rows, heads]) for i in range(len(heads))]
    print(" | ".join(str(h).ljust(w) for h, w in zip(heads, widths)))
    print("-+-".join("-" * w for w in widths))
    for r in rows:
        print(" | ".join(str(x).ljust(w) for x, w in zip(r, widths)))
