"""Example corpora for RA-ICL: (PyTorch module, kernel) pairs from files, the hub, or the built-in suite.

A corpus spec (what `kforge rag build --corpus` takes) is one of:

- ``builtin``: the built-in suite's problems with their reference Triton solutions (works offline);
- ``kernelbook``: ``GPUMODE/KernelBook`` (PyTorch -> Triton) from the Hugging Face hub;
- ``sakana``: ``SakanaAI/AI-CUDA-Engineer-Archive`` (PyTorch -> CUDA) from the hub;
- ``hf:<owner/name>``: another hub dataset with one of the column layouts below;
- a ``.jsonl`` or ``.parquet`` file.

File rows follow this schema (one JSON object per line for .jsonl)::

    {"name": "19_ReLU",               # required: what the module does
     "pytorch_code": "...",           # required: the reference module (class Model ...)
     "kernel_code": "...",            # required: a ModelNew implementing it with a custom kernel
     "backend": "triton" | "cuda",    # optional: guessed from kernel_code when absent
     "source": "...",                 # optional: where the pair comes from (default: the file)
     "problem_key": "1/19"}           # optional: LEVEL/ID of the problem it solves

Rows laid out like KernelBook (``module_name``/``python_code``/``triton_code``) or the Sakana archive
(``Op_Name``/``PyTorch_Code_Module``/``CUDA_Code``/``Correct``) are read too, so a downloaded parquet
file of either works as is. Sakana rows that failed its correctness check are skipped, and of its many
kernels per task only the fastest correct one is kept.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Iterable, Iterator

from kforge.jsonl import iter_objects
from kforge.kernel_backends import KERNEL_BACKENDS, SOLUTIONS_BACKEND, guess_backend
from kforge.policy.examples import Example
from kforge.rag.errors import RagError
from kforge.rag.text import code_hash, code_tokens, structure_hash

KERNELBOOK = "GPUMODE/KernelBook"
SAKANA = "SakanaAI/AI-CUDA-Engineer-Archive"
HUB_ALIASES = {"kernelbook": KERNELBOOK, "sakana": SAKANA}

# Column names, first match wins: our schema, then KernelBook's, then the Sakana archive's.
_NAME_COLUMNS = ("name", "module_name", "Op_Name", "entry_point", "Kernel_Name")
_PYTORCH_COLUMNS = ("pytorch_code", "python_code", "PyTorch_Code_Module")
_KERNEL_COLUMNS = ("kernel_code", "triton_code", "CUDA_Code")
_BACKEND_OF_COLUMN = {b.corpus_column: b.name for b in KERNEL_BACKENDS.values()}


@dataclass(frozen=True)
class CorpusEntry:
    """One worked example: a PyTorch module and a kernel implementation of it."""

    name: str
    pytorch_code: str
    kernel_code: str
    backend: str
    source: str
    problem_key: str | None = None

    @cached_property
    def pytorch_hash(self) -> str:
        return code_hash(self.pytorch_code)

    @cached_property
    def structure_hash(self) -> str:
        """Equal for PyTorch modules that differ only in sizes, comments and docstrings."""
        return structure_hash(self.pytorch_code)

    @cached_property
    def pair_hash(self) -> str:
        """Identity for dedup: the pair with comments and whitespace normalised away."""
        return hashlib.sha256(f"{self.pytorch_hash}|{code_hash(self.kernel_code)}".encode()).hexdigest()

    @cached_property
    def pytorch_tokens(self) -> frozenset[str]:
        return code_tokens(self.pytorch_code)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "CorpusEntry":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})

    def to_example(self, score: float | None = None) -> Example:
        return Example(
            name=self.name,
            pytorch_code=self.pytorch_code,
            kernel_code=self.kernel_code,
            backend=self.backend,
            source=self.source,
            score=score,
            problem_key=self.problem_key,
        )


@dataclass
class Corpus:
    """What one spec yielded: its entries and how many rows were read or skipped (and why)."""

    spec: str
    source: str
    entries: list[CorpusEntry]
    rows: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    @property
    def digest(self) -> str:
        """A hash of the corpus content (normalised pairs, in order): the manifest records it."""
        h = hashlib.sha256()
        for entry in self.entries:
            h.update(entry.pair_hash.encode())
            h.update(entry.backend.encode())
        return h.hexdigest()


def load_corpus(spec: str) -> Corpus:
    """Read one corpus spec (see the module docstring); raises RagError with a one-line reason."""
    text = (spec or "").strip()
    if not text:
        raise RagError("empty corpus spec: use builtin, kernelbook, sakana, hf:<dataset>, or a .jsonl/.parquet file")
    lowered = text.lower()
    if lowered == "builtin":
        return load_builtin()
    if lowered in HUB_ALIASES:
        return load_hub(HUB_ALIASES[lowered], spec=text)
    if lowered.startswith("hf:"):
        return load_hub(text[3:], spec=text)
    path = Path(text).expanduser()
    if path.suffix in (".jsonl", ".parquet"):
        if not path.is_file():
            raise RagError(f"corpus file {path} does not exist: give the path of a .jsonl or .parquet file")
        return load_jsonl(path) if path.suffix == ".jsonl" else load_parquet(path)
    if path.exists():
        raise RagError(
            f"corpus {path} is not a .jsonl or .parquet file: convert it to one (schema in `kforge rag build --help`)"
        )
    raise RagError(
        f"unknown corpus {text!r}: use builtin, kernelbook, sakana, hf:<owner/name>, or a .jsonl/.parquet file"
    )


def load_builtin() -> Corpus:
    """The built-in problems that carry a reference solution (Triton), keyed by their LEVEL/ID."""
    try:
        from kforge.problems import builtin_problems  # lazy: the problems package may be growing
    except ImportError as exc:
        raise RagError(f"the built-in suite is unavailable ({exc}); pass --corpus FILE instead") from None
    problems = builtin_problems()
    entries = [
        CorpusEntry(
            name=p.name,
            pytorch_code=p.code,
            kernel_code=p.solution,
            backend=SOLUTIONS_BACKEND,
            source=p.source,
            problem_key=p.key,
        )
        for p in problems
        if p.solution
    ]
    skipped = {"no solution": len(problems) - len(entries)} if len(entries) < len(problems) else {}
    return Corpus("builtin", "builtin", entries, rows=len(problems), skipped=skipped)


def load_jsonl(path: Path) -> Corpus:
    source = f"jsonl:{path}"

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        for where, _, row in iter_objects(path, RagError, "a JSON object with name, pytorch_code and kernel_code"):
            yield where, row

    return _corpus_from_rows(str(path), source, rows())


def load_parquet(path: Path) -> Corpus:
    try:
        import pyarrow.parquet as pq  # optional: only for parquet corpora
    except ImportError:
        raise RagError(
            f"reading {path} needs pyarrow (pip install pyarrow); or convert it to .jsonl with the same columns"
        ) from None
    try:
        table = pq.read_table(path)
    except Exception as exc:  # a broken or non-parquet file: one line for the user
        raise RagError(f"could not read {path} as parquet ({type(exc).__name__}: {_first_line(exc)})") from None
    records = table.to_pylist()
    return _corpus_from_rows(str(path), f"parquet:{path}", ((f"{path}[{i}]", r) for i, r in enumerate(records)))


def load_hub(dataset: str, spec: str | None = None) -> Corpus:
    """Every split of a hub dataset, through the optional `datasets` package (needs the internet once)."""
    try:
        import datasets  # optional: kforge never depends on it
    except ImportError:
        raise RagError(
            f"corpus {dataset} needs the `datasets` package (pip install datasets) and internet access; or "
            "download it as parquet and pass the file with --corpus"
        ) from None
    try:
        loaded = datasets.load_dataset(dataset)
    except Exception as exc:  # offline, unknown dataset, hub error: all end the same way for the user
        raise RagError(
            f"could not load {dataset} from Hugging Face ({type(exc).__name__}: {_first_line(exc)}); "
            "check the network, or download it as parquet and pass the file with --corpus"
        ) from None
    splits = loaded.values() if hasattr(loaded, "values") else [loaded]

    def rows() -> Iterator[tuple[str, dict[str, Any]]]:
        for split in splits:
            for i, row in enumerate(split):
                yield f"{dataset}[{i}]", row

    return _corpus_from_rows(spec or f"hf:{dataset}", f"hf:{dataset}", rows())


def dedupe(entries: Iterable[CorpusEntry]) -> tuple[list[CorpusEntry], int]:
    """Entries with a pair (PyTorch, kernel) not seen before, after normalising comments and whitespace."""
    seen: set[str] = set()
    kept: list[CorpusEntry] = []
    dropped = 0
    for entry in entries:
        if entry.pair_hash in seen:
            dropped += 1
            continue
        seen.add(entry.pair_hash)
        kept.append(entry)
    return kept, dropped


def _first(row: dict[str, Any], columns: tuple[str, ...]) -> tuple[str | None, Any]:
    for column in columns:
        value = row.get(column)
        if value is not None and (not isinstance(value, str) or value.strip()):
            return column, value
    return None, None


def _corpus_from_rows(spec: str, default_source: str, rows: Iterable[tuple[str, dict[str, Any]]]) -> Corpus:
    """Map rows of any supported layout to entries, counting what is skipped and why."""
    entries: list[CorpusEntry] = []
    skipped: dict[str, int] = {}
    # Sakana-style rows: (task) -> (speedup, index into entries); only the fastest correct kernel stays.
    best_of_task: dict[tuple[Any, Any], tuple[float, int]] = {}
    n = 0
    for _where, row in rows:
        n += 1
        reason, entry = _entry_from_row(row, default_source)
        if entry is None:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        task = (row.get("Level_ID"), row.get("Task_ID"))
        if task[0] is not None and task[1] is not None:
            speed = _as_float(row.get("CUDA_Speedup_Native"))
            if task in best_of_task:
                skipped["slower kernel of the same task"] = skipped.get("slower kernel of the same task", 0) + 1
                if speed <= best_of_task[task][0]:
                    continue
                entries[best_of_task[task][1]] = entry
                best_of_task[task] = (speed, best_of_task[task][1])
                continue
            best_of_task[task] = (speed, len(entries))
        entries.append(entry)
    if n == 0:
        raise RagError(f"corpus {spec} has no rows: expected objects with name, pytorch_code and kernel_code")
    if not entries:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(skipped.items()))
        raise RagError(
            f"corpus {spec}: none of its {n} rows is usable ({reasons}); each row needs name, pytorch_code and "
            "kernel_code (see `kforge rag build --help`)"
        )
    return Corpus(spec, default_source, entries, rows=n, skipped=skipped)


def _entry_from_row(row: dict[str, Any], default_source: str) -> tuple[str, CorpusEntry | None]:
    if "Correct" in row and not row.get("Correct"):
        return "marked incorrect", None
    _, pytorch_code = _first(row, _PYTORCH_COLUMNS)
    kernel_column, kernel_code = _first(row, _KERNEL_COLUMNS)
    if not isinstance(pytorch_code, str) or not isinstance(kernel_code, str):
        return "missing pytorch_code or kernel_code", None
    _, name = _first(row, _NAME_COLUMNS)
    if name is None:
        name = f"entry_{code_hash(pytorch_code)[:12]}"
    backend = row.get("backend") or _BACKEND_OF_COLUMN.get(kernel_column or "") or guess_backend(kernel_code)
    if backend not in KERNEL_BACKENDS:
        return "unknown backend", None
    key = row.get("problem_key")
    return "", CorpusEntry(
        name=str(name).strip(),
        pytorch_code=pytorch_code,
        kernel_code=kernel_code,
        backend=str(backend),
        source=str(row.get("source") or default_source),
        problem_key=str(key) if key is not None else None,
    )


def _as_float(value: object) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return float("-inf")
    return number if number == number else float("-inf")  # NaN ranks last


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else "no details"
