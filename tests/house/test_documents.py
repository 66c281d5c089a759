"""One module per document on disk: each of kforge's documents is read raw and written by its own module
alone (everyone else calls it), and a verdict's speedup and baseline are set by the judging functions only."""

from __future__ import annotations

import ast

from source_tree import KFORGE, module_name, parse, sources

# -- one module per document on disk ------------------------------------------------------------------------
# kforge's own documents, each with the module that alone reads it raw and writes it (everyone else calls it),
# and the spellings that name the document in a raw read or write.
DOCUMENTS = {
    "RAG manifest (manifest.json)": ("kforge.rag.manifest", ("manifest.json", "MANIFEST_FILE")),
    "eval results (eval_results-*.json)": ("kforge.eval.results", ("eval_results", "summary_by_split", "out_path")),
    "KernelBench baseline file": ("kforge.problems.baseline", ("baseline_file", "baseline_time")),
    "run status (status.json)": ("kforge.runs.folder", ("status.json", "STATUS_FILE")),
    "generated curriculum's manifest (curriculum.json)": ("kforge.problems.generate.folder", ("curriculum.json",)),
}
# Every module that reads or writes a file raw (json.load/loads/dump, write_text, atomic_write_text), and the
# files it owns. A module not listed here calls the owner's reader or writer.
RAW_IO = {
    "kforge.rag.manifest": "the RAG manifest",
    "kforge.eval.results": "the eval results file",
    "kforge.problems.baseline": "KernelBench baseline files",
    "kforge.runs.folder": "status.json, config.yaml, metrics/checkpoints JSONL, a checkpoint's trainer state",
    "kforge.runs.checkpoints": "the checks of a checkpoint's files (reads only)",
    "kforge.runs.transcripts": "samples/step_N.jsonl",
    "kforge.rag.index": "an index's entries.jsonl",
    "kforge.jsonl": "JSONL problem sources",
    "kforge.problems.kernelbench": "the KernelBench cache (revision.json, problem files)",
    "kforge.problems.selfcheck": "a built-in problem's temp solution file",
    "kforge.eval.target": "--candidates JSONL, an adapter's PEFT adapter_config.json",
    "kforge.learner.lora": "an adapter's PEFT adapter_config.json",
    "kforge.learner.learner": "a learner checkpoint's meta.json",
    "kforge.ops.export": "an exported adapter's config and model card",
    "kforge.ops.doctor_data": "an embedder folder's sentence-transformers files",
    "kforge.ops.doctor_runtime": "the Triton probe's script and its answer",
    "kforge.ops.run_control": "the STOP file",
    "kforge.train.metrics": "the W&B run id",
    "kforge.evaluator.wire": "the child protocol's frames",
    "kforge.evaluator.context": "the pool's secret salt",
    "kforge.evaluator.children": "cgroup control files",
    "kforge.evaluator.freeze": "cgroup control files",
    "kforge.evaluator.layers": "cgroup control files",
    "kforge.evaluator.pool": "the CUDA build cache's done marker",
    "kforge.train.sft": "the warm start's record (sft.json) and its (problem, solution) pairs",
    "kforge.problems.generate.folder": "a generated curriculum's files (problems, sft pairs, manifest)",
}


def raw_io(source: str) -> list[tuple[int, str]]:
    """(line, source text) of every raw file read or write in `source`."""
    found = []
    for node in ast.walk(parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
        on_json = isinstance(func, ast.Attribute) and getattr(func.value, "id", None) == "json"
        if (on_json and name in ("load", "loads", "dump")) or name in ("write_text", "atomic_write_text"):
            found.append((node.lineno, ast.get_source_segment(source, node) or ""))
    return found


def stray_document_io(files: dict[str, str]) -> list[str]:
    """Raw reads and writes outside the modules allowed them, and of a listed document outside its module."""
    bad = []
    for module, source in files.items():
        for line, text in raw_io(source):
            if module not in RAW_IO:
                bad.append(f"{module}:{line}: {text[:80]}")
            for document, (owner, names) in DOCUMENTS.items():
                if module != owner and any(n in text for n in names):
                    bad.append(f"{module}:{line}: {document} outside {owner}")
    return sorted(bad)



def test_each_document_on_disk_is_read_and_written_by_its_module_alone():
    files = sources()
    assert {owner for owner, _ in DOCUMENTS.values()} <= set(RAW_IO)
    assert set(RAW_IO) <= set(files), set(RAW_IO) - set(files)  # a module that went away leaves the list
    assert stray_document_io(files) == []


def test_the_document_check_sees_a_stray_reader_and_writer():
    files = {"kforge.cli.train": "import json\nguard = json.loads(path.read_text())\n",
             "kforge.ops.doctor_data": "m = json.loads((folder / 'manifest.json').read_text())\n",
             "kforge.cli.rag": "atomic_write_text(run.path / STATUS_FILE, text)\n",
             "kforge.rag.manifest": "json.loads((folder / MANIFEST_FILE).read_text())\n"}
    assert stray_document_io(files) == [
        "kforge.cli.rag:1: atomic_write_text(run.path / STATUS_FILE, text)",
        "kforge.cli.rag:1: run status (status.json) outside kforge.runs.folder",
        "kforge.cli.train:2: json.loads(path.read_text())",
        "kforge.ops.doctor_data:1: RAG manifest (manifest.json) outside kforge.rag.manifest"]


def test_a_verdicts_speedup_and_baseline_are_set_by_the_judging_functions_only():
    setters = sorted({module_name(p) for p in KFORGE.rglob("*.py") for node in ast.walk(parse(p.read_text()))
                      if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(t, ast.Attribute) and t.attr in ("speedup", "baseline")})
    assert setters == ["kforge.evaluator.judge"]
