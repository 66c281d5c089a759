"""The retriever behind prompt_option=raicl: the k corpus examples whose PyTorch side is closest to a problem.

It implements kforge.policy.examples.ExampleRetriever. The problem itself is never returned: entries
with the same name, the same task name ("19_ReLU" ~ "3_ReLU"), the same source and LEVEL/ID, or the
same PyTorch code up to sizes, comments and docstrings are skipped. Several kernels for one PyTorch
module (or for size variants of it) count once, the best scoring, so k examples show k different
modules. Query vectors and results are cached per problem, so calling `retrieve` on every turn of every
episode costs one query embedding per problem (none when its code is in the index) and one search.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import numpy as np

from kforge.policy.examples import Example
from kforge.policy.prompts import PROMPT_OPTIONS
from kforge.problems.record import Problem
from kforge.rag.corpus import CorpusEntry
from kforge.rag.embed import Embedder, EmbedderSpec, resolve_embedder
from kforge.rag.errors import RagError
from kforge.rag.index import StoredIndex, load_index
from kforge.rag.manifest import read_manifest
from kforge.rag.text import bare_name, code_hash, embedding_text, structure_hash

if TYPE_CHECKING:
    from kforge.config.schema import DatasetConfig


class RagRetriever:
    """Examples from an index folder built by `kforge rag build`."""

    def __init__(self, stored: StoredIndex, embedder: Embedder) -> None:
        self.stored = stored
        self.embedder = embedder
        self.entries: list[CorpusEntry] = stored.entries
        self._vectors: dict[tuple[str, str, str], np.ndarray] = {}
        self._results: dict[tuple[str, str, str, int], list[Example]] = {}
        # PyTorch code already in the index needs no query embedding: its stored vector is the same
        # model's embedding of the same text (the built-in suite asked against its own index, say).
        self._stored_rows: dict[str, int] = {}
        for row, entry in enumerate(self.entries):
            self._stored_rows.setdefault(entry.pytorch_hash, row)
        self._lock = threading.Lock()
        self._checked_dim = False

    @property
    def backend(self) -> str:
        return self.stored.backend

    @property
    def size(self) -> int:
        return len(self.entries)

    def retrieve(self, problem: Problem, k: int) -> list[Example]:
        """The k closest examples to `problem`, best first, never `problem` itself."""
        if k <= 0 or not self.entries:
            return []
        key = (problem.source, problem.key, code_hash(problem.code), k)
        with self._lock:
            found = self._results.get(key)
        if found is None:
            found = self._search(self._query_vector(problem), k, problem)
            with self._lock:
                self._results[key] = found
        return list(found)

    def search_code(self, pytorch_code: str, k: int) -> list[Example]:
        """The k closest examples to a PyTorch module given as text (copies of that code are skipped)."""
        probe = Problem(level=0, problem_id=0, name="", code=pytorch_code, source="query")
        return self.retrieve(probe, k)

    # ------------------------------------------------------------------ internals
    def _query_vector(self, problem: Problem) -> np.ndarray:
        key = (problem.source, problem.key, code_hash(problem.code))
        with self._lock:
            cached = self._vectors.get(key)
        if cached is not None:
            return cached
        row = self._stored_rows.get(key[2])
        if row is not None:
            vector = self.stored.index.reconstruct(row).reshape(1, -1).astype(np.float32)
            with self._lock:
                self._vectors[key] = vector
            return vector
        vector = self.embedder.encode([embedding_text(problem.code)])
        if not self._checked_dim:
            if vector.shape[1] != self.stored.dim:
                raise RagError(
                    f"embedder {self.embedder.name} gives {vector.shape[1]}-dimensional vectors but the index at "
                    f"{self.stored.folder} holds {self.stored.dim}-dimensional ones: query with the embedder "
                    "that built it, or rebuild the index"
                )
            self._checked_dim = True
        with self._lock:
            self._vectors[key] = vector
        return vector

    def _search(self, vector: np.ndarray, k: int, problem: Problem) -> list[Example]:
        index = self.stored.index
        total = index.ntotal
        skip = _SelfMatch(problem)
        fetch = min(total, max(4 * k + 8, 32))
        while True:
            with _one_search_thread():
                scores, ids = index.search(vector, fetch)
            chosen: list[Example] = []
            seen_modules: set[str] = set()
            for score, i in zip(scores[0], ids[0]):
                if i < 0:
                    continue
                entry = self.entries[int(i)]
                if entry.structure_hash in seen_modules or skip.matches(entry):
                    continue
                seen_modules.add(entry.structure_hash)
                chosen.append(entry.to_example(round(float(score), 4)))
                if len(chosen) == k:
                    return chosen
            if fetch >= total:
                return chosen
            fetch = min(total, fetch * 4)


@contextlib.contextmanager
def _one_search_thread() -> Iterator[None]:
    """One OpenMP thread for a single-vector search: a 20k-entry flat search takes ~1 ms on one thread
    but ~30 ms with two on a busy 2-core machine (threads wait on each other). The setting is the calling
    thread's own (OpenMP's nthreads is per thread), so other threads and torch are not affected."""
    faiss: Any = __import__("faiss")
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


class _SelfMatch:
    """Decides whether an entry is the asked problem in another guise. Code similarity short of the
    same structure is not used: KernelBench siblings (ReLU vs Sigmoid, GRU vs GRUHidden) share almost
    every token and are exactly the neighbours worth showing."""

    def __init__(self, problem: Problem) -> None:
        self.problem = problem
        self.bare = bare_name(problem.name)
        self.structure = structure_hash(problem.code)

    def matches(self, entry: CorpusEntry) -> bool:
        p = self.problem
        if p.name and entry.name == p.name:
            return True
        if self.bare and bare_name(entry.name) == self.bare:
            return True
        if entry.problem_key is not None and entry.problem_key == p.key and entry.source == p.source:
            return True
        return entry.structure_hash == self.structure


def retriever_for(dataset: "DatasetConfig") -> RagRetriever | None:
    """The example retriever a run's prompts need (prompt_option=raicl), or None for every other option."""
    if not PROMPT_OPTIONS[dataset.prompt_option].retrieves:
        return None
    if not dataset.rag_index_path:
        raise RagError(f"dataset.prompt_option={dataset.prompt_option} needs dataset.rag_index_path "
                       "(build one with `kforge rag build`)")
    return load_retriever(dataset.rag_index_path, backend=dataset.backend)


def load_retriever(
    index_dir: str,
    embedder: str | None = None,
    *,
    backend: str | None = None,
    device: str | None = "cpu",
) -> RagRetriever:
    """A retriever over the index in `index_dir`.

    embedder: the model to embed queries with; None = the one recorded in the manifest. A different model
    is refused (its vectors would not be comparable with the index). backend: when given, an index built
    for another backend is refused. device: where query embeddings run (CPU by default: one short text per
    problem, and it keeps the GPUs to rollouts and the learner).
    """
    folder = Path(index_dir).expanduser()
    manifest = read_manifest(folder)
    built = EmbedderSpec(manifest["embedder"]["name"], manifest["embedder"].get("location", ""))
    if embedder is not None:
        claimed = resolve_embedder(embedder)
        if not claimed.same_model(built):
            raise RagError(
                f"index at {folder} was built with embedder {built.name} (dim {manifest['embedder']['dim']}), "
                f"not {claimed.name}: query it with --embedder {built.name} (or no --embedder), or rebuild it "
                f"with `kforge rag build --embedder {claimed.name}`"
            )
        name = claimed.name
    else:
        name = built.name
    if backend is not None and manifest.get("backend") != backend:
        raise RagError(
            f"index at {folder} holds {manifest.get('backend')} kernels, not {backend}: build one with "
            f"`kforge rag build --backend {backend}` and point dataset.rag_index_path at it"
        )
    stored = load_index(folder)
    return RagRetriever(stored, Embedder(name, device=device))
