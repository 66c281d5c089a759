"""Retrieval-augmented in-context examples (RA-ICL): corpora, leak guard, embeddings, FAISS index, retriever.

    build_index(out_dir, backend, corpora, embedder, hnsw, protect)  -> BuildReport   (`kforge rag build`)
    load_retriever(index_dir, embedder=None)                          -> RagRetriever  (prompt_option=raicl)
    retriever_for(cfg.dataset)                                        -> RagRetriever or None (a run's prompts)

Heavy libraries (faiss, sentence-transformers) are imported only when an index is built or queried.
"""

from kforge.rag.build import BuildReport, build_index, default_corpora
from kforge.rag.corpus import Corpus, CorpusEntry, dedupe, load_corpus
from kforge.rag.embed import DEFAULT_EMBEDDER, Embedder, resolve_embedder
from kforge.rag.errors import RagError
from kforge.rag.leak import DEFAULT_LEAK_THRESHOLD, LeakGuard, LeakReport, protected_test_split
from kforge.rag.retriever import RagRetriever, load_retriever, retriever_for

__all__ = [
    "DEFAULT_EMBEDDER",
    "DEFAULT_LEAK_THRESHOLD",
    "BuildReport",
    "Corpus",
    "CorpusEntry",
    "Embedder",
    "LeakGuard",
    "LeakReport",
    "RagError",
    "RagRetriever",
    "build_index",
    "dedupe",
    "default_corpora",
    "load_corpus",
    "load_retriever",
    "protected_test_split",
    "resolve_embedder",
    "retriever_for",
]
