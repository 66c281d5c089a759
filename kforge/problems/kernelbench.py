"""Finding KernelBench (ScalingIntelligence/KernelBench) without ceremony, and fetching it once.

The `kernelbench` source is resolved in this order; the first that exists wins:

1. an explicit path (a checkout or a .jsonl file) given as the source itself (handled by `sources`);
2. the `KERNELBENCH_ROOT` environment variable (a checkout);
3. an installed `kernelbench` package that carries the problem files (an editable install of a checkout);
4. the local cache `<cache_root>/kernelbench`, filled once by `kforge problems fetch kernelbench` from the
   Hugging Face dataset or a git checkout, with the revision it was fetched at.

Each location reports the revision it holds (a git commit, the dataset's commit, the package version),
so results say which KernelBench they were measured on.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

from kforge.config.paths import cache_root
from kforge.problems.record import Problem
from kforge.problems.sources import (
    HF_DATASET,
    HF_LEVELS,
    KERNELBENCH_ENV,
    ProblemSourceError,
    level_dirs,
    load_hf,
)

GIT_URL = "https://github.com/ScalingIntelligence/KernelBench"
REVISION_FILE = "revision.json"
HOW_TO_GET = (
    "KernelBench not found: pass a checkout or a .jsonl file as the source (dataset.source=PATH), "
    f"set {KERNELBENCH_ENV}=<checkout>, install the kernelbench package from a checkout (pip install -e), "
    "or run `kforge problems fetch kernelbench` once with network access"
)


@dataclass(frozen=True)
class Location:
    """Where a problem set was found: the folder or file, how it was found, and the revision it holds."""

    path: Path
    found_by: str  # "path", "KERNELBENCH_ROOT", "kernelbench package", "cache", "builtin", "hf"
    revision: str | None = None

    def describe(self) -> str:
        rev = f" @ {self.revision}" if self.revision else " (revision unknown)"
        return f"{self.found_by} {self.path}{rev}"


@dataclass
class FetchRecord:
    """What `kforge problems fetch kernelbench` wrote: kept as revision.json inside the cache."""

    via: str  # "hf" or "git"
    origin: str  # dataset name or git URL/path
    revision: str | None
    fetched: str
    counts: dict[str, int]


def cache_dir() -> Path:
    return cache_root() / "kernelbench"


def locate(env: dict[str, str] | None = None) -> Location:
    """KERNELBENCH_ROOT, else an installed package with the problem files, else the fetched cache."""
    env = os.environ if env is None else env
    root = env.get(KERNELBENCH_ENV, "").strip()
    if root:
        path = Path(root).expanduser()
        if not path.is_dir():
            raise ProblemSourceError(
                f"{KERNELBENCH_ENV}={root} is not a folder: point it at a KernelBench checkout, or unset it"
            )
        return Location(path, KERNELBENCH_ENV, checkout_revision(path))
    package = package_checkout()
    if package is not None:
        return package
    cached = cache_dir()
    if level_dirs(cached / "KernelBench"):
        return Location(cached, "cache", checkout_revision(cached))
    raise ProblemSourceError(HOW_TO_GET)


def package_checkout() -> Location | None:
    """The problem folder of an installed `kernelbench` package, when it carries one.

    KernelBench's own package finds its problems at `<repo>/KernelBench` from `<repo>/src/kernelbench`, so
    an editable install of a checkout has them; a wheel without the files does not count.
    """
    try:
        spec = importlib.util.find_spec("kernelbench")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    folders = list(spec.submodule_search_locations or []) or ([str(Path(spec.origin).parent)] if spec.origin else [])
    for folder in map(Path, folders):
        for candidate in (folder.parent.parent, folder, folder.parent):
            if level_dirs(candidate / "KernelBench") or level_dirs(candidate):
                return Location(candidate, "kernelbench package", checkout_revision(candidate) or _package_version())
    return None


def describe_source(spec: str) -> Location:
    """Where a problem source spec points and its revision, without reading the problems."""
    from kforge.problems.sources import BUILTIN_ROOT

    text = (spec or "").strip()
    kind, _, arg = text.partition(":")
    if text.lower() == "builtin":
        return Location(BUILTIN_ROOT, "builtin", _kforge_version())
    if text.lower() == "kernelbench":
        return locate()
    if text.lower() == "hf" or (kind.lower() == "hf" and arg):
        return Location(Path(arg or HF_DATASET), "hf", None)
    path = Path(arg if kind.lower() in ("kernelbench", "jsonl") and arg else text).expanduser()
    if path.is_file():
        return Location(path, "path", f"sha256:{_sha256(path)[:12]}")
    return Location(path, "path", checkout_revision(path) if path.is_dir() else None)


def checkout_revision(root: Path) -> str | None:
    """The git commit of a checkout, or the revision a fetched cache recorded; None when neither is known."""
    record = read_fetch_record(root)
    if record is not None:
        return record.revision
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def read_fetch_record(root: Path) -> FetchRecord | None:
    path = root / REVISION_FILE
    if not path.is_file():
        return None
    try:
        return FetchRecord(**json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError):
        return None  # a damaged record only loses the revision label, never the problems


# --- fetching ----------------------------------------------------------------------------------------------


def fetch(
    via: str = "auto",
    origin: str | None = None,
    revision: str | None = None,
    dest: Path | None = None,
    say: Callable[[str], None] = lambda _msg: None,
) -> FetchRecord:
    """Fill `dest` (default: the cache) with KernelBench's problem files and a revision.json.

    via: "hf" (the dataset, through the optional `datasets` package), "git" (a clone of `origin`, default
    the GitHub repository; any git URL or local repository works), or "auto" (hf when `datasets` is
    installed, else git). The new copy replaces the old one only once it is complete.
    """
    dest = cache_dir() if dest is None else dest
    if via == "auto":
        via = "hf" if importlib.util.find_spec("datasets") is not None else "git"
    if via not in ("hf", "git"):
        raise ProblemSourceError(f"unknown fetch method {via!r}: use hf, git or auto")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".kernelbench-", dir=dest.parent))
    try:
        if via == "git":
            origin = origin or GIT_URL
            revision = _fetch_git(origin, revision, staging, say)
        else:
            origin = origin or HF_DATASET
            revision = _fetch_hf(origin, revision, staging, say)
        counts = {name: len(list(folder.glob("*.py"))) for name, folder in _named_levels(staging / "KernelBench")}
        if not counts:
            raise ProblemSourceError(f"{origin} holds no KernelBench/levelN/*.py problem files: nothing was cached")
        record = FetchRecord(via, origin, revision, datetime.now(timezone.utc).isoformat(timespec="seconds"), counts)
        (staging / REVISION_FILE).write_text(json.dumps(asdict(record), indent=2) + "\n", encoding="utf-8")
        if dest.exists():
            shutil.rmtree(dest)
        staging.rename(dest)
        return record
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _fetch_git(origin: str, revision: str | None, staging: Path, say: Callable[[str], None]) -> str | None:
    if shutil.which("git") is None:
        raise ProblemSourceError(
            "fetching KernelBench with git needs the git command: install git, or `pip install datasets` and use "
            "--via hf"
        )
    clone = staging / "clone"
    # A shallow clone is enough for the newest commit; a named revision needs the history to check it out.
    cmd = ["git", "clone", "--quiet"] + ([] if revision else ["--depth", "1"]) + [origin, str(clone)]
    say(f"cloning {origin}")
    _git(cmd, origin)
    if revision:
        _git(["git", "-C", str(clone), "checkout", "--quiet", revision], origin)
    commit = _git(["git", "-C", str(clone), "rev-parse", "HEAD"], origin).strip()
    source = clone / "KernelBench" if level_dirs(clone / "KernelBench") else clone
    for name, folder in _named_levels(source):
        shutil.copytree(folder, staging / "KernelBench" / name)
        say(f"{name}: {len(list(folder.glob('*.py')))} files")
    shutil.rmtree(clone)
    return commit


def _git(cmd: list[str], origin: str) -> str:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        raise ProblemSourceError(f"git timed out fetching {origin}: check the network, or clone it yourself and "
                                 f"set {KERNELBENCH_ENV}") from None
    if out.returncode != 0:
        reason = (out.stderr or out.stdout).strip().splitlines()
        raise ProblemSourceError(
            f"git could not fetch {origin} ({reason[-1] if reason else 'exit ' + str(out.returncode)}): check the "
            f"network and the URL, or clone it yourself and set {KERNELBENCH_ENV}"
        )
    return out.stdout


def _fetch_hf(dataset: str, revision: str | None, staging: Path, say: Callable[[str], None]) -> str | None:
    commit = revision
    try:
        from huggingface_hub import HfApi

        # Pin the dataset's commit first so every split comes from the same revision, and record it.
        commit = HfApi().dataset_info(dataset, revision=revision).sha or revision
    except ImportError:
        pass
    except Exception as exc:  # offline or unknown dataset: the user needs the reason, not a traceback
        raise ProblemSourceError(
            f"could not reach {dataset} on the Hugging Face hub ({type(exc).__name__}: {_first_line(exc)}); "
            f"check the network, or use --via git, or set {KERNELBENCH_ENV} to a checkout"
        ) from None
    for level in HF_LEVELS:
        say(f"downloading {dataset} level_{level}")
        for p in load_hf(dataset, {level}, revision=commit):
            _write_problem(staging / "KernelBench", p)
    return commit


def _write_problem(base: Path, problem: Problem) -> None:
    folder = base / f"level{problem.level}"
    folder.mkdir(parents=True, exist_ok=True)
    name = problem.name if problem.name.startswith(f"{problem.problem_id}_") else f"{problem.problem_id}_{problem.name}"
    (folder / f"{name}.py").write_text(problem.code, encoding="utf-8")


def _named_levels(base: Path) -> list[tuple[str, Path]]:
    return [(f"level{level}", folder) for level, folder in level_dirs(base)]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"kernelbench {version('kernelbench')}"
    except PackageNotFoundError:
        return None


def _kforge_version() -> str:
    from kforge import __version__

    return f"kforge {__version__}"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else "no message"
