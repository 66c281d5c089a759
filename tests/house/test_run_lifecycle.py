"""The run's lifecycle lives beside the trainer: only it changes a run folder's status, config or
records, and the trainer always holds a dashboard (a null one off a terminal), never None."""

from __future__ import annotations

import ast
from collections import defaultdict

from locations import REPO
from source_tree import parse, sources

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
        for node in ast.walk(parse(source)):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            owner = getattr(func.value, "id", "") if isinstance(func, ast.Attribute) else ""
            if name in names and (name != "create" or owner == "RunFolder"):
                found[module].add(name)
    return found


def test_only_the_run_lifecycle_writes_a_runs_status_and_no_command_does():
    writers = run_folder_writes(sources())
    assert set(writers) <= RUN_WRITERS, {m: w for m, w in writers.items() if m not in RUN_WRITERS}
    assert run_folder_writes({"kforge.cli.train": "run.set_status('failed')\nrun = RunFolder.create(d, n, y)\n",
                              "kforge.cli.eval_cmd": "plan.create()\n"}) == {
        "kforge.cli.train": {"set_status", "create"}}


# -- the trainer always has a view ---------------------------------------------------------------------------------
def dashboard_none_checks(files: dict[str, str]) -> list[str]:
    """`module:line` of each `dashboard is None` / `is not None` (a dashboard that may be missing)."""
    found = []
    for module, source in files.items():
        for node in ast.walk(parse(source)):
            if (isinstance(node, ast.Compare) and any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops)
                    and any(isinstance(c, ast.Constant) and c.value is None for c in node.comparators)):
                left = node.left
                name = left.attr if isinstance(left, ast.Attribute) else getattr(left, "id", "")
                if "dashboard" in name.lower():
                    found.append(f"{module}:{node.lineno}")
    return sorted(found)


def _methods(module: str, cls: str) -> dict[str, str]:
    """A class's public methods (and __enter__/__exit__) -> their parameters, as written."""
    tree = parse((REPO / (module.replace(".", "/") + ".py")).read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    return {f.name: ast.unparse(f.args) for f in body if isinstance(f, ast.FunctionDef)
            and (not f.name.startswith("_") or f.name in ("__enter__", "__exit__"))}


def test_the_trainer_holds_a_null_dashboard_with_every_method_of_the_dashboard_and_nothing_asks_for_none():
    assert dashboard_none_checks(sources()) == []
    assert dashboard_none_checks({"kforge.train.x": "if self.dashboard is not None:\n    pass\n",
                                  "kforge.train.y": "f = dashboard.warn if dashboard is None else g\n",
                                  "kforge.train.z": "if self.learner is None:\n    pass\n"}) == [
        "kforge.train.x:1", "kforge.train.y:1"]
    real = _methods("kforge.ui.dashboard", "Dashboard")
    assert {"stage", "advance", "kernel", "warn", "end_step", "__enter__"} <= set(real)
    assert _methods("kforge.ui.null", "NullDashboard") == real
