"""The package's shape, read from its source with `ast` (nothing is imported): no import circle between
modules (function-level imports included), no package importing one above it, no file over 400 lines; and
at its edges: one module per document on disk, no edit of a resolved config, one user-error type, one table
per choice (the schema's literal equal to it, no branch on a name outside it)."""

from __future__ import annotations

import ast
import functools
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent / "kforge"
# Bottom to top: a package may import only packages to its left (and itself).
LAYERS = ["errors", "jsonl", "space", "config", "kernel_backends", "gpus", "served", "modelio", "ui", "problems", "evaluator",
          "rollout", "policy", "rag", "credit", "learner", "runs", "eval", "train", "ops", "cli", "__main__"]
MAX_LINES = 400
# Files allowed over the limit while a split is pending; this list may only shrink (it is empty now).
PENDING_SPLIT: set[str] = set()
# Each check walks every module's tree: a source is parsed once for the whole file (no check changes a tree).
_parse = functools.lru_cache(maxsize=None)(ast.parse)


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the kforge modules it imports anywhere in its body (`from pkg import sub` counts as `pkg.sub`;
    a module's own parent packages are always loaded first and are left out)."""
    files = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in files.items():
        for node in ast.walk(_parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "kforge":
                subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in files]
                targets = subs or [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names if a.name.split(".")[0] == "kforge"]
            graph[name].update(t for t in targets if t in files and not name.startswith(t + "."))
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    comp.append(member)
                    if member == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "kforge"


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    rank = {name: i for i, name in enumerate(LAYERS)}
    bad = []
    for module, targets in graph.items():
        for target in targets:
            a, b = _package(module), _package(target)
            if a != b and b != "kforge" and rank[b] > rank[a]:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def test_every_package_has_a_layer():
    packages = {_package(m) for m in import_graph()} - {"kforge"}
    assert packages <= set(LAYERS), packages - set(LAYERS)


def test_no_import_circle():
    assert cycles(import_graph()) == []


def test_no_upward_import():
    assert upward_imports(import_graph()) == []


def test_the_checks_see_a_circle_and_an_upward_import():
    graph = {"kforge.problems.a": {"kforge.problems.b"}, "kforge.problems.b": {"kforge.problems.a"},
             "kforge.policy.x": {"kforge.train.y"}, "kforge.train.y": set()}
    assert cycles(graph) == [["kforge.problems.a", "kforge.problems.b"]]
    assert upward_imports(graph) == ["kforge.policy.x -> kforge.train.y"]


def test_no_file_over_400_lines():
    long = {str(p.relative_to(ROOT.parent)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert set(long) <= PENDING_SPLIT, long


def test_the_readme_layout_lists_every_folder_and_module():
    """The layout block (docs/architecture.md, linked from the README's Layout) names every folder and module."""
    readme = (ROOT.parent / "docs" / "architecture.md").read_text()
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    listed = {line.split()[0].rstrip("/") for line in block.splitlines() if line.startswith("  ") and line.split()}
    present = {p.name for p in ROOT.iterdir()
               if (p.is_dir() and p.name != "__pycache__") or (p.suffix == ".py" and not p.name.startswith("__"))}
    assert listed == present


# -- the evaluator by side ------------------------------------------------------------------------------------
# What runs inside the sandboxed child lives in evaluator/child/, the static source checks in evaluator/static/,
# the parent's side in evaluator/ itself. Shared by both sides (each imports them): the protocol's names and
# frames, and the sandbox's layers, which a child applies to itself and the parent probes (layers.py, in a
# throwaway fork) and sets up (children.py: ids and cgroup; pool.py: the environment).
CHILD, STATIC = "kforge.evaluator.child", "kforge.evaluator.static"
CHILD_SHARED = ("kforge.evaluator.protocol", "kforge.evaluator.wire", "kforge.evaluator.sandbox",
                "kforge.evaluator.confine", "kforge.evaluator.mounts")


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def side_crossings(graph: dict[str, set[str]]) -> list[str]:
    """Imports across the evaluator's sides: a child/ module importing any kforge module outside child/ and
    CHILD_SHARED; a module outside child/ importing child/ (the parent starts the zygote by its module name
    and never loads a child's code); static/ or a shared module importing child/ or the parent's side."""
    parent = [m for m in graph if _under(m, "kforge.evaluator") and m != "kforge.evaluator"
              and not _under(m, CHILD) and not _under(m, STATIC) and m not in CHILD_SHARED]
    bad = []
    for module, targets in graph.items():
        for target in sorted(targets):
            if _under(module, CHILD):
                wrong = not _under(target, CHILD) and target not in CHILD_SHARED
            elif _under(module, STATIC) or module in CHILD_SHARED:
                wrong = _under(target, CHILD) or target in parent
            else:
                wrong = _under(target, CHILD)
            if wrong:
                bad.append(f"{module} -> {target}")
    return sorted(bad)


def test_the_evaluators_child_imports_only_its_side_and_the_shared_modules():
    graph = import_graph()
    assert set(CHILD_SHARED) <= set(graph), set(CHILD_SHARED) - set(graph)  # a module that went away leaves
    assert side_crossings(graph) == []
    # The zygote the parent starts is the child's.
    boot = (ROOT / "evaluator" / "children.py").read_text()
    assert f"from {CHILD}.zygote import main" in boot


def test_the_side_check_sees_a_child_reaching_the_parent_and_a_parent_loading_the_child():
    graph = {"kforge.evaluator.child.loop": {"kforge.evaluator.judge", "kforge.evaluator.wire",
                                             "kforge.evaluator.child.guard", "kforge.config.schema"},
             "kforge.evaluator.child.guard": {"kforge.evaluator.protocol"},
             "kforge.evaluator.judge": {"kforge.evaluator.child.guard", "kforge.evaluator.protocol"},
             "kforge.evaluator.static.static_check": {"kforge.evaluator.child.loop"},
             "kforge.evaluator.protocol": {"kforge.evaluator.static.static_check", "kforge.evaluator.judge"},
             "kforge.evaluator.wire": set(), "kforge.policy.parsing": {"kforge.evaluator.static.static_check"}}
    assert side_crossings(graph) == [
        "kforge.evaluator.child.loop -> kforge.config.schema",
        "kforge.evaluator.child.loop -> kforge.evaluator.judge",
        "kforge.evaluator.judge -> kforge.evaluator.child.guard",
        "kforge.evaluator.protocol -> kforge.evaluator.judge",
        "kforge.evaluator.static.static_check -> kforge.evaluator.child.loop"]


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
    for node in ast.walk(_parse(source)):
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


def _sources() -> dict[str, str]:
    return {_module(p): p.read_text() for p in ROOT.rglob("*.py")}


def test_each_document_on_disk_is_read_and_written_by_its_module_alone():
    files = _sources()
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
    setters = sorted({_module(p) for p in ROOT.rglob("*.py") for node in ast.walk(_parse(p.read_text()))
                      if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                      for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                      if isinstance(t, ast.Attribute) and t.attr in ("speedup", "baseline")})
    assert setters == ["kforge.evaluator.judge"]


# -- a resolved config is never edited ------------------------------------------------------------------------
RESOLVE_STEP = {"kforge.config.loader"}  # builds a config from its layers (a derived value is one more layer)


def config_edits(files: dict[str, str]) -> list[str]:
    """Assignments (and setattr) to a config's fields: `X.section.field = ...` for a section of KforgeConfig and
    a field of it, or `cfg.field = ...`, outside the resolve step."""
    from pydantic import BaseModel

    from kforge.config.schema import KforgeConfig

    sections = {name: set(info.annotation.model_fields) for name, info in KforgeConfig.model_fields.items()
                if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}

    def edits(target: ast.expr) -> bool:
        if not isinstance(target, ast.Attribute):
            return False
        owner = target.value
        if isinstance(owner, ast.Attribute) and target.attr in sections.get(owner.attr, ()):
            return True  # cfg.model.name, self.cfg.log.run_name, ...
        named = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        return named in ("cfg", "config") and target.attr in KforgeConfig.model_fields

    bad = []
    for module, source in files.items():
        if module in RESOLVE_STEP:
            continue
        for node in ast.walk(_parse(source)):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Attribute) and first.attr in sections or getattr(first, "id", "") == "cfg":
                    bad.append(f"{module}:{node.lineno}: setattr on a config")
            bad += [f"{module}:{node.lineno}: {ast.unparse(t)} =" for t in targets if edits(t)]
    return sorted(bad)


def test_no_code_edits_a_resolved_config():
    assert config_edits(_sources()) == []


def test_the_config_check_sees_an_edit():
    files = {"kforge.modelio": "cfg.model.max_model_len = limit\ncfg.episode.context_budget_tokens, x = 1, 2\n",
             "kforge.eval.runner": "self.cfg.model.name = self.target.model\n",
             "kforge.cli.train": "cfg.preset = 'x'\nsetattr(cfg.log, 'run_name', name)\n",
             "kforge.ops.export": "merged.config.use_cache = True\nself.model.device = 'cpu'\n",
             "kforge.config.loader": "cfg.model.name = 'resolving'\n"}
    assert config_edits(files) == [
        "kforge.cli.train:1: cfg.preset =", "kforge.cli.train:2: setattr on a config",
        "kforge.eval.runner:1: self.cfg.model.name =",
        "kforge.modelio:1: cfg.model.max_model_len =", "kforge.modelio:2: cfg.episode.context_budget_tokens ="]


# -- one user-error type ---------------------------------------------------------------------------------------
def test_every_domain_error_for_the_user_is_a_user_error_under_its_own_name():
    import importlib

    from kforge.errors import UserError

    names = {"kforge.config.loader": "ConfigError", "kforge.rag.errors": "RagError", "kforge.gpus": "GpuIndexError",
             "kforge.policy.prompts": "PromptError", "kforge.credit.rewards": "RewardOrderError",
             "kforge.train.build": "SetupError", "kforge.train.placement": "PlacementError",
             "kforge.eval.results": "ResultsFileError",
             "kforge.eval.target": "EvalTargetError", "kforge.eval.build": "EvalSetupError",
             "kforge.space": "UnwritableFolder", "kforge.problems.sources": "ProblemSourceError",
             "kforge.runs.locate": "LocateError", "kforge.ops.export": "ExportError"}
    for module, name in names.items():
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), name


# -- one table per choice --------------------------------------------------------------------------------------
def _literal(model: type, name: str) -> list[str]:
    from typing import get_args

    return list(get_args(model.model_fields[name].annotation))


def test_each_choice_of_the_config_is_its_table():
    """A choice's names live in one table, read by name nowhere else; the schema's literal lists the same names
    in the same order (the literal is what a config is checked against when it is resolved)."""
    from kforge.config.losses import LOSSES
    from kforge.config.reward_order import REWARD_COMPONENTS, SPEED_FORMS
    from kforge.config.schema import DatasetConfig, LearnerConfig, RewardConfig
    from kforge.kernel_backends import KERNEL_BACKENDS
    from kforge.learner.losses import KL_LOSSES
    from kforge.policy.prompts import PROMPT_OPTIONS

    assert _literal(DatasetConfig, "backend") == list(KERNEL_BACKENDS)
    assert all(name == backend.name for name, backend in KERNEL_BACKENDS.items())
    assert _literal(DatasetConfig, "prompt_option") == list(PROMPT_OPTIONS)
    assert _literal(LearnerConfig, "loss_fn") == list(LOSSES)
    assert _literal(LearnerConfig, "kl_estimator") == list(KL_LOSSES)
    assert _literal(RewardConfig, "speed_form") == list(SPEED_FORMS)
    weights = [c.weight for c in REWARD_COMPONENTS.values()]
    assert sorted(weights) == sorted([f for f in RewardConfig.model_fields if f.endswith("_weight")] + ["flagged_penalty"])


def choice_branches(files: dict[str, str], choice: set[str], table: str = "kforge.kernel_backends") -> list[str]:
    """Branches on a choice's name (`backend == "cuda"`, `b not in ("triton", "cuda")`) and literals that list
    its names (a tuple, list or set of them only, a dict keyed by two or more) outside its table's module. Not
    branches: a torch device's type (`device.type == "cuda"`), a name as a key or module (`"triton" in
    sys.modules`, `x in ("torch", "triton", "math")`) and a config literal (`Literal["triton", "cuda"]`,
    checked against the table above)."""

    def listed(node: ast.AST | None) -> set[str]:
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or not node.elts:
            return set()
        if all(isinstance(e, ast.Constant) and e.value in choice for e in node.elts):
            return {e.value for e in node.elts}  # type: ignore[attr-defined]
        return set()

    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in choice

    bad = []
    for module, source in files.items():
        if module == table:
            continue
        tree = _parse(source)
        literals = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
                    and getattr(n.value, "id", getattr(n.value, "attr", None)) == "Literal"}
        for node in ast.walk(tree):
            found = ""
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                device = any(isinstance(o, ast.Attribute) and o.attr == "type" for o in operands)
                for left, op, right in zip(operands, node.ops, operands[1:]):
                    if isinstance(op, (ast.In, ast.NotIn)) and listed(right):
                        found = "branch"
                    elif not isinstance(op, (ast.In, ast.NotIn)) and not device and (named(left) or named(right)):
                        found = "branch"
            elif id(node) not in literals and len(listed(node)) > 1:
                found = "list"
            elif isinstance(node, ast.Dict) and sum(1 for k in node.keys if k is not None and named(k)) > 1:
                found = "table"
            if found:
                bad.append(f"{module}:{node.lineno}: {found} {ast.unparse(node)[:60]}")
    return sorted(bad)


def test_the_kernel_backends_are_branched_on_and_listed_in_their_table_only():
    from kforge.kernel_backends import KERNEL_BACKENDS

    assert choice_branches(_sources(), set(KERNEL_BACKENDS)) == []  # 24 in 12 modules before the table


def test_the_losses_speed_forms_and_prompt_options_are_branched_on_in_their_tables_only():
    from kforge.config.losses import LOSSES
    from kforge.config.reward_order import SPEED_FORMS
    from kforge.policy.prompts import PROMPT_OPTIONS

    files = _sources()
    assert choice_branches(files, set(LOSSES), "kforge.config.losses") == []
    assert choice_branches(files, set(SPEED_FORMS), "kforge.config.reward_order") == []
    assert choice_branches(files, set(PROMPT_OPTIONS), "kforge.policy.prompts") == []


def test_the_backend_check_sees_a_branch_a_list_and_a_table():
    files = {"kforge.ops.doctor": 'need = cfg.dataset.backend == "cuda"\nok = b not in ("triton", "cuda")\n',
             "kforge.rag.corpus": 'HUB = {"triton": "kernelbook", "cuda": "sakana"}\nif "cuda" != kind: pass\n',
             "kforge.learner.ddp": 'gpu = self.device.type == "cuda"\n',
             "kforge.problems.selfcheck": 'a = "triton" in sys.modules\nb = m in ("torch", "triton", "math")\n',
             "kforge.config.schema": 'backend: Literal["triton", "cuda"] = "triton"\n',
             "kforge.kernel_backends": 'if backend == "cuda": pass\n'}
    assert choice_branches(files, {"triton", "cuda"}) == [
        "kforge.ops.doctor:1: branch cfg.dataset.backend == 'cuda'",
        "kforge.ops.doctor:2: branch b not in ('triton', 'cuda')",
        "kforge.ops.doctor:2: list ('triton', 'cuda')",
        "kforge.rag.corpus:1: table {'triton': 'kernelbook', 'cuda': 'sakana'}",
        "kforge.rag.corpus:2: branch 'cuda' != kind"]


def user_error_classes(files: dict[str, str]) -> set[str]:
    """The names of UserError and every class that derives from it, read from the source."""
    bases = {node.name: {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
             for source in files.values() for node in ast.walk(_parse(source)) if isinstance(node, ast.ClassDef)}
    found = {"UserError"}
    while grown := {name for name, of in bases.items() if name not in found and of & found}:
        found |= grown
    return found


def translations(files: dict[str, str]) -> list[tuple[str, bool]]:
    """Each `raise` inside `except ... as exc` whose new error is built from `exc` (str(exc), f"{exc}", ...), as
    ("module:line: except Names", is a re-wrap: every caught type is a UserError and the message is the
    caught one alone, `X(str(exc))`, which says nothing the caught error did not)."""
    users = user_error_classes(files)
    found = []
    for module, source in files.items():
        for handler in ast.walk(_parse(source)):
            if not (isinstance(handler, ast.ExceptHandler) and handler.name and handler.type is not None):
                continue
            caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", "?") for t in caught]
            for node in ast.walk(handler):
                if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                    continue
                args = node.exc.args
                if not any(isinstance(n, ast.Name) and n.id == handler.name for a in args for n in ast.walk(a)):
                    continue
                alone = len(args) == 1 and ast.unparse(args[0]) == f"str({handler.name})"
                found.append((f"{module}:{node.lineno}: except {', '.join(names)}", alone and set(names) <= users))
    return sorted(found)


# Translations into the CLI's one line that remain, for errors that are not UserErrors: a model that cannot be
# loaded, a run that cannot be stopped (exit 1), the learner's own failure (its first line). This may only go down.
MAX_CLI_TRANSLATIONS = 7


def test_a_user_error_is_caught_once_and_never_re_wrapped():
    found = translations(_sources())
    # The one catch: a UserError raised anywhere under a command becomes its one line (cli/common.py).
    assert [where.split(":")[0] for where, rewrap in found if rewrap] == ["kforge.cli.common"]
    in_cli = [where for where, _ in found
              if where.startswith("kforge.cli.") and not where.startswith("kforge.cli.common:")]
    assert len(in_cli) <= MAX_CLI_TRANSLATIONS, in_cli


def test_the_translation_check_sees_a_re_wrap_and_a_translation_with_context():
    files = {"kforge.cli.x": "class BadThing(UserError):\n    pass\n"
                             "try:\n    go()\nexcept BadThing as exc:\n    raise fail(str(exc)) from None\n",
             "kforge.eval.y": "try:\n    go()\nexcept (OSError, KeyError) as e:\n"
                              "    raise BadThing(f'{e}; pick --out') from None\n"}
    assert translations(files) == [("kforge.cli.x:6: except BadThing", True),
                                   ("kforge.eval.y:4: except OSError, KeyError", False)]


# -- the run's lifecycle lives beside the trainer ------------------------------------------------------------------
# Who changes a run folder's status, config or records: the folder itself, the trainer (the status of the loop it
# runs), the lifecycle around it (opening, repairing, an end the trainer never saw) and `kforge runs stop --now`.
RUN_WRITERS = {"kforge.runs.folder", "kforge.train.trainer", "kforge.train.lifecycle", "kforge.ops.run_control"}


def run_folder_writes(files: dict[str, str]) -> dict[str, set[str]]:
    """module -> the run-changing calls it makes (set_status, write_status, record_config, RunFolder.create,
    drop_torn_line)."""
    names = {"set_status", "write_status", "record_config", "create", "drop_torn_line"}
    found: dict[str, set[str]] = defaultdict(set)
    for module, source in files.items():
        for node in ast.walk(_parse(source)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            if name in names and (name != "create" or owner == "RunFolder"):
                found[module].add(name)
    return found


def test_only_the_run_lifecycle_writes_a_runs_status_and_no_command_does():
    writers = run_folder_writes(_sources())
    assert set(writers) <= RUN_WRITERS, {m: w for m, w in writers.items() if m not in RUN_WRITERS}
    assert run_folder_writes({"kforge.cli.train": "run.set_status('failed')\nrun = RunFolder.create(d, n, y)\n",
                              "kforge.cli.eval_cmd": "plan.create()\n"}) == {
        "kforge.cli.train": {"set_status", "create"}}


# -- the trainer always has a view ---------------------------------------------------------------------------------
def dashboard_none_checks(files: dict[str, str]) -> list[str]:
    """`module:line` of each `dashboard is None` / `is not None` (a dashboard that may be missing)."""
    found = []
    for module, source in files.items():
        for node in ast.walk(_parse(source)):
            if (isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
                    and any(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)):
                left = node.left
                name = left.attr if isinstance(left, ast.Attribute) else getattr(left, "id", "")
                if "dashboard" in name.lower():
                    found.append(f"{module}:{node.lineno}")
    return sorted(found)


def _methods(module: str, cls: str) -> dict[str, str]:
    """A class's public methods (and __enter__/__exit__) -> their parameters, as written."""
    tree = _parse((ROOT.parent / (module.replace(".", "/") + ".py")).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {f.name: ast.unparse(f.args) for f in body if isinstance(f, ast.FunctionDef)
            and (not f.name.startswith("_") or f.name in ("__enter__", "__exit__"))}


def test_the_trainer_holds_a_null_dashboard_with_every_method_of_the_dashboard_and_nothing_asks_for_none():
    assert dashboard_none_checks(_sources()) == []
    assert dashboard_none_checks({"kforge.train.x": "if self.dashboard is not None:\n    pass\n",
                                  "kforge.train.y": "f = dashboard.warn if dashboard is None else g\n",
                                  "kforge.train.z": "if self.learner is None:\n    pass\n"}) == [
        "kforge.train.x:1", "kforge.train.y:1"]
    real = _methods("kforge.ui.dashboard", "Dashboard")
    assert {"stage", "advance", "kernel", "warn", "end_step", "__enter__"} <= set(real)
    assert _methods("kforge.ui.null", "NullDashboard") == real
