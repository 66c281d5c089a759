"""Build time and query latency of the RA-ICL index on a synthetic corpus.

    python -m bench.rag_build [--n 20000] [--embed-sample 0] [--batch-size 64] [--json results.json]

Generates N distinct (PyTorch module, Triton kernel) pairs from op templates (1-4 ops, random shapes,
constants and wording), writes them as a JSONL corpus, and times `build_index` stage by stage with the
default offline embedder and the leak guard protecting the KernelBench problems (the shared
problems.jsonl when present, else the built-in suite). Then it times an HNSW build over the same
vectors, loading the index, and `retrieve` per problem (uncached: one query embedding plus the search;
cached: the search only), and raw FAISS search latency and HNSW recall@10 against the exact index.

MiniLM reads up to 256 word pieces per module, a few GFLOP each: on a small shared CPU that is a few to
a few tens of modules per second. `--embed-sample S` (S < N) keeps the run short there: the full
pipeline (`build_index`) runs on the first S entries with the real embedder, which gives the measured
throughput, and the N-entry numbers for every other stage (read, dedup, leak guard, index, save, load,
queries) are measured on all N entries, whose vectors are the S real ones repeated with small noise.
The N-entry embedding time is then reported as extrapolated, never as measured.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.common import kernelbench_jsonl

os.environ.setdefault("HF_HUB_OFFLINE", "1")

UNARY = {
    "relu": "torch.relu({x})",
    "gelu": "torch.nn.functional.gelu({x})",
    "sigmoid": "torch.sigmoid({x})",
    "tanh": "torch.tanh({x})",
    "silu": "torch.nn.functional.silu({x})",
    "softplus": "torch.nn.functional.softplus({x})",
    "exp": "torch.exp({x})",
    "abs": "torch.abs({x})",
    "hardtanh": "torch.nn.functional.hardtanh({x}, min_val=-{c}, max_val={c})",
    "leaky_relu": "torch.nn.functional.leaky_relu({x}, negative_slope={c})",
    "scale": "{x} * {c}",
    "clamp": "torch.clamp({x}, min=-{c}, max={c})",
}
ROWWISE = {
    "softmax": "torch.softmax({x}, dim=-1)",
    "log_softmax": "torch.log_softmax({x}, dim=-1)",
    "layer_norm": "torch.nn.functional.layer_norm({x}, ({x}.shape[-1],))",
    "rms_norm": "{x} / torch.sqrt(torch.mean({x} * {x}, dim=-1, keepdim=True) + {c})",
    "cumsum": "torch.cumsum({x}, dim=-1)",
}
REDUCE = {
    "sum": "torch.sum({x}, dim={d})",
    "mean": "torch.mean({x}, dim={d})",
    "amax": "torch.amax({x}, dim={d})",
    "amin": "torch.amin({x}, dim={d})",
}
PHRASES = ["Simple model that", "A model that", "Module which", "Performs a computation that", "Network block that"]


def synthetic_pair(i: int, rng: random.Random) -> dict:
    """One distinct (PyTorch module, Triton kernel) pair."""
    ops: list[str] = []
    lines: list[str] = []
    x = "x"
    first = rng.random()
    in_features = rng.choice([64, 128, 256, 512, 1024, 2048, 4096])
    init_args = ""
    init_body = "        super().__init__()\n"
    init_inputs = "[]"
    if first < 0.3:  # a linear layer first
        out_features = rng.choice([64, 128, 256, 512, 1024])
        init_args = ", in_features: int, out_features: int"
        init_body += "        self.linear = nn.Linear(in_features, out_features)\n"
        init_inputs = f"[{in_features}, {out_features}]"
        lines.append(f"{x} = self.linear({x})")
        ops.append("linear")
    elif first < 0.4:
        lines.append(f"{x} = torch.matmul({x}, {x}.transpose(-1, -2))")
        ops.append("gram")
    for _ in range(rng.randint(1, 3)):
        table = rng.choice([UNARY, UNARY, ROWWISE])
        op = rng.choice(list(table))
        c = round(rng.uniform(0.01, 3.0), rng.choice([1, 2, 3]))
        lines.append(f"{x} = " + table[op].format(x=x, c=c))
        ops.append(op)
    if rng.random() < 0.3:
        op = rng.choice(list(REDUCE))
        lines.append(f"{x} = " + REDUCE[op].format(x=x, d=rng.choice([-1, 1])))
        ops.append(op)
    batch = rng.choice([8, 16, 32, 64, 128, 256])
    what = " then ".join(o.replace("_", " ") for o in ops)
    body = "\n".join(f"        {line}" for line in lines)
    pytorch = (
        "import torch\nimport torch.nn as nn\n\n\n"
        "class Model(nn.Module):\n"
        f'    """{rng.choice(PHRASES)} applies {what}."""\n\n'
        f"    def __init__(self{init_args}):\n{init_body}\n"
        "    def forward(self, x: torch.Tensor) -> torch.Tensor:\n"
        f"{body}\n        return x\n\n\n"
        f"batch_size = {batch}\nin_features = {in_features}\n\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, in_features)]\n\n\n"
        f"def get_init_inputs():\n    return {init_inputs}\n"
    )
    block = rng.choice([128, 256, 512, 1024, 2048])
    kname = "_".join(ops) + f"_kernel_{i}"
    kernel = (
        "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"
        f"@triton.jit\ndef {kname}(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    pid = tl.program_id(0)\n    offs = pid * BLOCK + tl.arange(0, BLOCK)\n    mask = offs < n\n"
        "    x = tl.load(x_ptr + offs, mask=mask)\n"
        f"    # fused: {what}\n    tl.store(out_ptr + offs, x, mask=mask)\n\n\n"
        f"class ModelNew(nn.Module):\n    def __init__(self{init_args}):\n        super().__init__()\n\n"
        "    def forward(self, x):\n        out = torch.empty_like(x)\n        n = x.numel()\n"
        f"        {kname}[(triton.cdiv(n, {block}),)](x, out, n, BLOCK={block})\n        return out\n"
    )
    return {
        "name": f"syn{i}_" + "_".join(ops),
        "pytorch_code": pytorch,
        "kernel_code": kernel,
        "backend": "triton",
        "source": "synthetic",
    }


def _build_without_embedding(corpus: Path, protect: list, out: Path, sample_index: Path, seed: int) -> dict:
    """Every stage of build_index on the whole corpus except the embedding: vectors are the sample's real
    ones, repeated with small noise and renormalised."""
    import numpy as np

    from kforge.rag.corpus import dedupe, load_corpus
    from kforge.rag.index import index_type, load_index, make_index, save_index
    from kforge.rag.leak import LeakGuard

    seconds: dict[str, float] = {}
    t = time.perf_counter()
    loaded = load_corpus(str(corpus))
    seconds["load"] = time.perf_counter() - t
    t = time.perf_counter()
    entries, duplicates = dedupe(loaded.entries)
    entries, leaks = LeakGuard(protect).filter(entries)
    seconds["filter"] = time.perf_counter() - t
    stored = load_index(sample_index)
    base = stored.index.reconstruct_n(0, stored.index.ntotal)
    rs = np.random.default_rng(seed)
    vectors = base[np.arange(len(entries)) % len(base)] + rs.normal(scale=0.02, size=(len(entries), base.shape[1]))
    vectors = (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)
    t = time.perf_counter()
    index = make_index(vectors, hnsw=False)
    seconds["index"] = time.perf_counter() - t
    manifest = dict(stored.manifest, count=len(entries), index={"type": index_type(index)},
                    note="bench: vectors of the embedded sample repeated with noise")
    t = time.perf_counter()
    save_index(out, index, entries, manifest)
    seconds["save"] = time.perf_counter() - t
    result = {k: round(v, 3) for k, v in seconds.items()}
    result.update(count=len(entries), duplicates=duplicates, leaks=leaks.dropped)
    return result


def percentiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"median_ms": statistics.median(ordered) * 1e3, "p90_ms": pick(0.9) * 1e3, "max_ms": ordered[-1] * 1e3}


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.rag_build", description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=20000, help="corpus entries")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="index folder (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--embed-sample", type=int, default=0,
                        help="embed only this many entries for real (0 = all); see the module docstring")
    args = parser.parse_args()

    import faiss
    import numpy as np
    import torch

    from kforge.problems import load_problems
    from kforge.rag import Embedder, build_index, load_retriever
    from kforge.rag.index import make_index

    results: dict[str, object] = {
        "load_average": os.getloadavg(),
        "n": args.n,
        "cpu_threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "faiss": faiss.__version__,
    }
    tmp = Path(tempfile.mkdtemp(prefix="kforge-rag-bench-"))
    out = args.out or tmp / "index"

    rng = random.Random(args.seed)
    t = time.perf_counter()
    corpus = tmp / "synthetic.jsonl"
    with corpus.open("w", encoding="utf-8") as handle:
        for i in range(args.n):
            handle.write(json.dumps(synthetic_pair(i, rng)) + "\n")
    results["generate_s"] = time.perf_counter() - t

    protect_source = str(kernelbench_jsonl()) if kernelbench_jsonl().is_file() else "builtin"
    protect = load_problems(protect_source)
    results["protected_problems"] = len(protect)

    embedder = Embedder(None, batch_size=args.batch_size)
    t = time.perf_counter()
    _ = embedder.dim  # load the model once, outside the stage timings
    results["embedder_load_s"] = time.perf_counter() - t
    results["max_seq_length"] = embedder.max_seq_length

    def progress(done: int, total: int) -> None:
        print(f"\r  embedded {done}/{total}", end="", file=sys.stderr, flush=True)

    sample = args.embed_sample if 0 < args.embed_sample < args.n else args.n
    if sample < args.n:
        sample_corpus = tmp / "sample.jsonl"
        with corpus.open(encoding="utf-8") as src, sample_corpus.open("w", encoding="utf-8") as dst:
            for _, line in zip(range(sample), src):
                dst.write(line)
        report = build_index(tmp / "sample-index", "triton", corpora=[str(sample_corpus)], embedder=embedder,
                             hnsw=False, protect=protect, progress=progress)
        print(file=sys.stderr)
        results["sample_build"] = {k: round(v, 3) for k, v in report.seconds.items()}
        rate = report.count / report.seconds["embed"]
        results["embed_per_s"] = rate
        results["embedded_for_real"] = report.count
        results["build"] = _build_without_embedding(corpus, protect, out, tmp / "sample-index", args.seed)
        results["build"]["embed_extrapolated"] = round(results["build"]["count"] / rate, 1)
        results["build"]["total_extrapolated"] = round(
            results["build"]["load"] + results["build"]["filter"] + results["build"]["embed_extrapolated"]
            + results["build"]["index"] + results["build"]["save"], 1)
    else:
        report = build_index(out, "triton", corpora=[str(corpus)], embedder=embedder, hnsw=False,
                             protect=protect, progress=progress)
        print(file=sys.stderr)
        results["build"] = {k: round(v, 3) for k, v in report.seconds.items()}
        results["build"]["count"] = report.count
        results["embed_per_s"] = report.count / report.seconds["embed"]
        results["embedded_for_real"] = report.count

    retriever = load_retriever(str(out))
    flat = retriever.stored.index
    vectors = flat.reconstruct_n(0, flat.ntotal)
    t = time.perf_counter()
    hnsw = make_index(vectors, hnsw=True)
    results["hnsw_build_s"] = time.perf_counter() - t

    t = time.perf_counter()
    retriever = load_retriever(str(out))
    results["load_retriever_s"] = time.perf_counter() - t
    problems = load_problems(protect_source)[:60]
    t = time.perf_counter()
    retriever.retrieve(problems[0], 3)
    results["first_retrieve_s"] = time.perf_counter() - t  # includes loading the embedder
    uncached, vector_cached, result_cached = [], [], []
    for p in problems[1:]:  # new problem: one query embedding and a search
        t = time.perf_counter()
        retriever.retrieve(p, 3)
        uncached.append(time.perf_counter() - t)
    for p in problems[1:]:  # same problem, another k: cached query vector, a fresh search
        t = time.perf_counter()
        retriever.retrieve(p, 4)
        vector_cached.append(time.perf_counter() - t)
    for p in problems[1:]:  # same problem and k: the cached result
        t = time.perf_counter()
        retriever.retrieve(p, 4)
        result_cached.append(time.perf_counter() - t)
    results["retrieve_uncached"] = percentiles(uncached)
    results["retrieve_vector_cached"] = percentiles(vector_cached)
    results["retrieve_result_cached"] = percentiles(result_cached)

    rs = np.random.default_rng(args.seed)
    queries = vectors[rs.choice(len(vectors), size=min(500, len(vectors)), replace=False)]
    queries = queries + rs.normal(scale=0.05, size=queries.shape).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    from kforge.rag.retriever import _one_search_thread

    for name, index in (("flat", flat), ("hnsw", hnsw)):
        for threads, context in (("default_threads", contextlib.nullcontext), ("one_thread", _one_search_thread)):
            times = []
            for q in queries:
                with context():
                    t = time.perf_counter()
                    index.search(q[None, :], 32)
                    times.append(time.perf_counter() - t)
            results[f"search_{name}_{threads}"] = percentiles(times)
    _, exact = flat.search(queries, 10)
    _, approx = hnsw.search(queries, 10)
    results["hnsw_recall_at_10"] = float(np.mean([len(set(a) & set(e)) / 10 for a, e in zip(approx, exact)]))

    results["load_average_end"] = os.getloadavg()
    print(json.dumps(results, indent=2, default=float))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
