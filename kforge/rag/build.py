"""`build_index`: corpora -> backend filter -> dedup -> leak guard -> embeddings -> FAISS index on disk."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

from kforge.kernel_backends import KERNEL_BACKENDS, names
from kforge.problems.record import Problem
from kforge.rag.corpus import (
    Corpus,
    CorpusEntry,
    dedupe,
    load_corpus,
)
from kforge.rag.embed import Embedder, Progress
from kforge.rag.errors import RagError
from kforge.rag.index import index_type, make_index, save_index
from kforge.rag.leak import DEFAULT_LEAK_THRESHOLD, LeakGuard, LeakReport
from kforge.rag.manifest import FORMAT_VERSION
from kforge.rag.text import embedding_text

log = logging.getLogger("kforge.rag")


@dataclass
class CorpusStats:
    spec: str
    source: str
    rows: int
    entries: int  # usable entries read (before the backend filter, dedup and leak guard)
    kept: int  # entries of this corpus that made it into the index
    skipped: dict[str, int]
    digest: str
    error: str | None = None  # why a requested corpus could not be read (only with allow_partial)


@dataclass
class BuildReport:
    out_dir: Path
    backend: str
    count: int
    embedder: str
    dim: int
    index_type: str
    corpora: list[CorpusStats]
    dropped: dict[str, int]  # other_backend, duplicates, leaks
    leak: LeakReport | None
    seconds: dict[str, float] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def default_corpora(backend: str) -> list[str]:
    """The corpora a build requests when none is named: the built-in suite and the backend's hub corpus."""
    return ["builtin", KERNEL_BACKENDS[backend].hub_corpus]


def build_index(
    out_dir: str | Path,
    backend: str = "triton",
    corpora: Sequence[str] | None = None,
    embedder: str | Embedder | None = None,
    hnsw: bool | None = None,
    protect: Sequence[Problem] | None = None,
    leak_threshold: float = DEFAULT_LEAK_THRESHOLD,
    progress: Progress | None = None,
    stage: Callable[[str], None] | None = None,
    allow_partial: bool = False,
    held_out_of: dict[str, object] | None = None,
) -> BuildReport:
    """Build the example index for `backend` into `out_dir` and return what happened.

    corpora: corpus specs (see kforge.rag.corpus); None = `default_corpora` (built-in + the hub corpus).
    allow_partial: a requested corpus that cannot be read (offline hub, missing package) is reported and
    left out instead of failing the build; the built-in suite is never optional.
    protect: the problems the leak guard protects; None turns the guard off (the CLI passes the test
    split of the configured problems unless --no-leak-guard); held_out_of: whose held-out set they are
    (recorded in the manifest for `kforge train` to check).
    progress: called with (done, total) while embedding. stage: called with the name of each step.
    """
    if backend not in KERNEL_BACKENDS:
        raise RagError(f"backend {backend!r} is not one of {names()}")
    say = stage or (lambda _msg: None)
    seconds: dict[str, float] = {}
    notes: list[str] = []
    t0 = time.perf_counter()

    specs = list(corpora) if corpora else default_corpora(backend)
    loaded: list[Corpus] = []
    missing: list[CorpusStats] = []
    for spec in specs:
        say(f"reading corpus {spec}")
        try:
            loaded.append(load_corpus(spec))
        except RagError as exc:
            # Quietly indexing less than was asked for gives weaker prompts nobody notices: fail unless told.
            if spec == "builtin":
                raise
            if not allow_partial:
                raise RagError(
                    f"corpus {spec} could not be read, so nothing was built: {exc} (or build from the other "
                    "corpora with --allow-partial)"
                ) from None
            notes.append(f"corpus {spec} left out (--allow-partial): {exc}")
            missing.append(CorpusStats(spec, spec, 0, 0, 0, {}, "", error=str(exc)))
    seconds["load"] = time.perf_counter() - t0

    t = time.perf_counter()
    dropped = {"other_backend": 0, "duplicates": 0, "leaks": 0}
    tagged: list[tuple[int, CorpusEntry]] = []
    for i, corpus in enumerate(loaded):
        for entry in corpus.entries:
            if entry.backend != backend:
                dropped["other_backend"] += 1
            else:
                tagged.append((i, entry))
    unique, dropped["duplicates"] = dedupe(entry for _, entry in tagged)
    owner = {id(entry): i for i, entry in tagged}

    leak_report: LeakReport | None = None
    if protect is not None:
        say(f"leak guard: checking {len(unique)} entries against {len(protect)} protected problems")
        unique, leak_report = LeakGuard(protect, leak_threshold).filter(unique)
        dropped["leaks"] = leak_report.dropped
    seconds["filter"] = time.perf_counter() - t
    if not unique:
        where = ", ".join(specs)
        raise RagError(
            f"no {backend} entries left to index from {where} (dropped: {_describe(dropped)}); add a corpus "
            f"with {backend} kernels (--corpus FILE.jsonl)"
        )

    model = embedder if isinstance(embedder, Embedder) else Embedder(embedder)
    say(f"embedding {len(unique)} PyTorch modules with {model.name}")
    t = time.perf_counter()
    vectors = model.encode([embedding_text(e.pytorch_code) for e in unique], progress=progress)
    seconds["embed"] = time.perf_counter() - t

    say("building the FAISS index")
    t = time.perf_counter()
    index = make_index(vectors, hnsw)
    seconds["index"] = time.perf_counter() - t

    kept_per_corpus = [0] * len(loaded)
    for entry in unique:
        kept_per_corpus[owner[id(entry)]] += 1
    stats = [
        CorpusStats(c.spec, c.source, c.rows, len(c.entries), kept_per_corpus[i], dict(c.skipped), c.digest)
        for i, c in enumerate(loaded)
    ] + missing
    out = Path(out_dir)
    manifest = {
        "format_version": FORMAT_VERSION,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "backend": backend,
        "count": len(unique),
        "embedder": {
            "name": model.spec.name,
            "location": model.spec.location,
            "dim": int(vectors.shape[1]),
            "max_seq_length": model.max_seq_length,
            "text": "pytorch_code without imports and comments",
        },
        "index": {"type": index_type(index), "metric": "inner_product", "normalized": True},
        "corpora": [s.__dict__ for s in stats],
        "dropped": dropped,
        "leak_guard": _leak_manifest(leak_report, held_out_of),
        "notes": notes,
    }
    say(f"writing {out}")
    t = time.perf_counter()
    save_index(out, index, unique, manifest)
    seconds["save"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - t0
    log.info("rag index %s: %d %s entries, %s", out, len(unique), backend, _describe(dropped))
    return BuildReport(
        out_dir=out,
        backend=backend,
        count=len(unique),
        embedder=model.spec.name,
        dim=int(vectors.shape[1]),
        index_type=index_type(index),
        corpora=stats,
        dropped=dropped,
        leak=leak_report,
        seconds=seconds,
        notes=notes,
    )


def _leak_manifest(report: LeakReport | None, held_out_of: dict[str, object] | None) -> dict[str, object]:
    if report is None:
        return {"enabled": False}
    return {
        **({"held_out_of": held_out_of} if held_out_of else {}),
        "enabled": True,
        "threshold": report.threshold,
        "protected": report.protected,
        "dropped": report.dropped,
        "by_reason": report.by_reason(),
        # Enough to audit what was removed without copying code into the manifest.
        "leaks": [leak.__dict__ for leak in report.leaks[:200]],
    }


def _describe(dropped: dict[str, int]) -> str:
    return ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in dropped.items())
