"""Problem sources, selection, the train/test split, lookup by spec, and `kforge problems`."""

from __future__ import annotations

import ast
import json
import random
import sys
import types
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.common import kernelbench_jsonl
from kforge.cli.app import app
from kforge.config.schema import DatasetConfig
from kforge.problems import (
    Problem,
    ProblemSourceError,
    builtin_problems,
    find_problem,
    load_problems,
    problems_from_config,
    select_problems,
    split_problems,
)
from locations import REPO

SHARED_JSONL = kernelbench_jsonl()  # $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl

PROBLEM_CODE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return {op}


def get_inputs():
    return [torch.randn(4, 4)]


def get_init_inputs():
    return []
"""


def _row(level: int, problem_id: int, name: str, op: str = "torch.relu(x)") -> dict:
    code = PROBLEM_CODE.format(op=op)
    return {"level": level, "problem_id": problem_id, "name": f"{problem_id}_{name}", "code": code}


def _write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _checkout(root: Path, nested: bool = True) -> Path:
    """A tiny KernelBench-style checkout: level1 with three problems and a helper, level2 with one."""
    base = root / "KernelBench" if nested else root
    files = {
        "level1/1_Square_matrix_multiplication_.py": "torch.matmul(x, x)",
        "level1/19_ReLU.py": "torch.relu(x)",
        "level1/23_Softmax.py": "torch.softmax(x, dim=1)",
        "level2/5_Gemm_ReLU.py": "torch.relu(x @ x)",
    }
    for rel, op in files.items():
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PROBLEM_CODE.format(op=op), encoding="utf-8")
    (base / "level1" / "__init__.py").write_text("", encoding="utf-8")
    (base / "level1" / "helpers.py").write_text("X = 1\n", encoding="utf-8")
    (root / "README.md").write_text("checkout\n", encoding="utf-8")
    return root


def _keys(problems: list[Problem]) -> list[str]:
    return [p.key for p in problems]


# --- the built-in suite, statically -------------------------------------------------------------


def test_builtin_suite_layout() -> None:
    problems = builtin_problems()
    assert len(problems) >= 12
    by_level = Counter(p.level for p in problems)
    assert set(by_level) == {1, 2} and by_level[1] >= 10 and 2 <= by_level[2] <= 4
    for level in (1, 2):
        ids = [p.problem_id for p in problems if p.level == level]
        assert ids == list(range(1, len(ids) + 1)), f"level {level} ids must run 1..N"
    for p in problems:
        assert p.source == "builtin"
        assert p.name.split("_", 1)[0] == str(p.problem_id) and len(p.name.split("_", 1)[1]) > 0
    assert _keys(problems) == sorted(_keys(problems), key=lambda k: tuple(map(int, k.split("/"))))
    # The brief's coverage: these ops must be present somewhere in the suite.
    names = " ".join(p.name.lower() for p in problems)
    for op in ("add", "relu", "gelu", "leakyrelu", "sum", "mean", "softmax", "norm", "matmul", "bias", "residual"):
        assert op in names, op


def _functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


def _init_args(tree: ast.Module, class_name: str) -> list[tuple[str, str | None]]:
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    init = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    args = init.args.args[1:]
    defaults = [None] * (len(args) - len(init.args.defaults)) + [ast.unparse(d) for d in init.args.defaults]
    return [(a.arg, d) for a, d in zip(args, defaults)]


@pytest.mark.parametrize("problem", builtin_problems(), ids=lambda p: p.key)
def test_builtin_problem_and_solution_shape(problem: Problem) -> None:
    tree = ast.parse(problem.code)
    assert {"get_inputs", "get_init_inputs"} <= set(_functions(tree))
    # Non-degenerate inputs: torch.rand is [0, 1) and would let e.g. a copy kernel pass for ReLU.
    assert "torch.rand(" not in problem.code and "torch.randn(" in problem.code
    # Inputs are created on the CPU; the evaluator places them.
    assert "cuda" not in problem.code and "device=" not in problem.code
    assert problem.solution is not None
    solution = ast.parse(problem.solution)
    assert _init_args(tree, "Model") == _init_args(solution, "ModelNew")
    jit_kernels = [
        f.name
        for f in _functions(solution).values()
        if any(ast.unparse(d) == "triton.jit" for d in f.decorator_list)
    ]
    assert jit_kernels, "the solution must define a @triton.jit kernel"
    # ...and launch it from forward as kernel[grid](...).
    model_new = next(n for n in solution.body if isinstance(n, ast.ClassDef) and n.name == "ModelNew")
    launched = {
        node.func.value.id
        for node in ast.walk(model_new)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and isinstance(node.func.value, ast.Name)
    }
    assert launched & set(jit_kernels)


# --- sources ---------------------------------------------------------------------------------------


@pytest.mark.skipif(not SHARED_JSONL.is_file(), reason="shared KernelBench jsonl not on this machine")
def test_shared_kernelbench_jsonl() -> None:
    problems = load_problems(str(SHARED_JSONL))
    assert len(problems) == 270
    assert Counter(p.level for p in problems) == {1: 100, 2: 100, 3: 50, 4: 20}
    assert all(p.source == f"jsonl:{SHARED_JSONL}" and p.solution is None for p in problems)
    assert find_problem(problems, "1/19").name == "19_ReLU"
    assert len(load_problems(str(SHARED_JSONL), [1, 2])) == 200
    # The recorded source string loads the same problems again.
    assert _keys(load_problems(problems[0].source, [3])) == [f"3/{i}" for i in range(1, 51)]


def test_jsonl_source(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [_row(2, 1, "Gemm"), _row(1, 19, "ReLU"), _row(1, 3, "Add", "x + x")])
    problems = load_problems(str(path))
    assert _keys(problems) == ["1/3", "1/19", "2/1"]
    assert problems[1].name == "19_ReLU" and "torch.relu(x)" in problems[1].code
    assert _keys(load_problems(str(path), [2])) == ["2/1"]
    assert _keys(load_problems(f"jsonl:{path}", [1])) == ["1/3", "1/19"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"level": 1, "problem_id": 1, "name": "1_A"}\n', "missing code"),
        ("{not json}\n", "not valid JSON"),
        ('{"level": "one", "problem_id": 1, "name": "1_A", "code": "x"}\n', "must be integers"),
        ("[1, 2]\n", "expected a JSON object"),
        ("\n\n", "has no rows"),
    ],
)
def test_jsonl_source_bad_rows(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ProblemSourceError, match=message) as info:
        load_problems(str(path))
    assert "\n" not in str(info.value) and str(path) in str(info.value)


def test_jsonl_duplicate_and_missing(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "dup.jsonl", [_row(1, 1, "A"), _row(1, 1, "B")])
    with pytest.raises(ProblemSourceError, match=r"dup.jsonl:2: problem 1/1 already defined on line 1"):
        load_problems(str(path))
    with pytest.raises(ProblemSourceError, match="does not exist"):
        load_problems(str(tmp_path / "missing.jsonl"))


@pytest.mark.parametrize("nested", [True, False], ids=["root/KernelBench/levelN", "root/levelN"])
def test_kernelbench_folder_source(tmp_path: Path, nested: bool) -> None:
    root = _checkout(tmp_path / "kb", nested=nested)
    problems = load_problems(str(root))
    assert _keys(problems) == ["1/1", "1/19", "1/23", "2/5"]
    assert [p.name for p in problems[:2]] == ["1_Square_matrix_multiplication_", "19_ReLU"]
    assert all(p.source == f"kernelbench:{root.resolve()}" for p in problems)
    assert _keys(load_problems(str(root), [2])) == ["2/5"]
    assert _keys(load_problems(f"kernelbench:{root}", [1])) == ["1/1", "1/19", "1/23"]


def test_kernelbench_source_through_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kforge.problems import kernelbench

    monkeypatch.delenv("KERNELBENCH_ROOT", raising=False)
    monkeypatch.setenv("KFORGE_CACHE_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(kernelbench, "package_checkout", lambda: None)
    with pytest.raises(ProblemSourceError, match="KERNELBENCH_ROOT"):
        load_problems("kernelbench")
    root = _checkout(tmp_path / "kb")
    monkeypatch.setenv("KERNELBENCH_ROOT", str(root))
    assert _keys(load_problems("kernelbench", [1])) == ["1/1", "1/19", "1/23"]


def test_kernelbench_folder_errors(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ProblemSourceError, match="no levelN folders"):
        load_problems(str(tmp_path / "empty"))
    root = _checkout(tmp_path / "kb")
    (root / "KernelBench" / "level1" / "19_ReLU_copy.py").write_text("x = 1\n", encoding="utf-8")
    with pytest.raises(ProblemSourceError, match="problem id 19 of level 1 also used by 19_ReLU.py"):
        load_problems(str(root))


def test_hf_source_without_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)  # import datasets -> ImportError, installed or not
    with pytest.raises(ProblemSourceError) as info:
        load_problems("hf", [1])
    message = str(info.value)
    assert "\n" not in message and "pip install datasets" in message
    assert ".jsonl" in message and "KERNELBENCH_ROOT" in message


def test_hf_source_offline(monkeypatch: pytest.MonkeyPatch) -> None:
    # Stands in for `datasets` on a machine without internet: the hub call fails the way it does offline.
    calls = []

    def load_dataset(name: str, split: str):
        calls.append((name, split))
        raise ConnectionError("Couldn't reach 'ScalingIntelligence/KernelBench' on the Hub\nsecond line")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    with pytest.raises(ProblemSourceError) as info:
        load_problems("hf", [2])
    assert calls == [("ScalingIntelligence/KernelBench", "level_2")]
    message = str(info.value)
    assert "\n" not in message and "ConnectionError" in message and "level_2" in message and ".jsonl" in message


def test_hf_source_rows(monkeypatch: pytest.MonkeyPatch) -> None:
    # Checks the row mapping on rows shaped like the dataset's (code, level, name, problem_id).
    splits = {"level_1": [_row(1, 19, "ReLU")], "level_3": [_row(3, 1, "MLP")]}
    fake = types.SimpleNamespace(load_dataset=lambda name, split: splits[split])
    monkeypatch.setitem(sys.modules, "datasets", fake)
    problems = load_problems("hf", [3, 1])
    assert _keys(problems) == ["1/19", "3/1"] and problems[0].source == "hf:ScalingIntelligence/KernelBench"


@pytest.mark.parametrize(
    ("source", "message"),
    [("nope", "unknown problem source 'nope'"), ("", "empty problem source"), ("pyproject.toml", "not .jsonl")],
)
def test_bad_sources(source: str, message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    with pytest.raises(ProblemSourceError, match=message):
        load_problems(source)


def test_bad_levels_and_level_filter() -> None:
    with pytest.raises(ProblemSourceError, match="bad level 0"):
        load_problems("builtin", [0])
    assert {p.level for p in load_problems("builtin", [2])} == {2}
    assert load_problems("builtin", [3]) == []
    assert len(load_problems("builtin", [])) == len(builtin_problems())
    assert issubclass(ProblemSourceError, ValueError)


# --- selection -------------------------------------------------------------------------------------


@pytest.fixture()
def many() -> list[Problem]:
    rows = [_row(1, i, name) for i, name in [(1, "Add"), (3, "ReLU"), (19, "ReLU_big"), (23, "Softmax")]]
    rows += [_row(2, i, name) for i, name in [(1, "Gemm_ReLU"), (3, "Conv_Add")]]
    return [Problem(**r, source="test") for r in rows]


def test_select_by_range_and_names(many: list[Problem]) -> None:
    assert _keys(select_problems(many)) == _keys(many)
    assert _keys(select_problems(many, start=3, end=19)) == ["1/3", "1/19", "2/3"]
    assert _keys(select_problems(many, start=19)) == ["1/19", "1/23"]
    assert _keys(select_problems(many, end=1)) == ["1/1", "2/1"]
    assert _keys(select_problems(many, names=["2/3", "23_softmax"])) == ["1/23", "2/3"]
    assert _keys(select_problems(many, names=["3"])) == ["1/3", "2/3"]  # an id: every level's problem 3
    assert _keys(select_problems(many, names=["19"])) == ["1/19"]  # not 1/1 nor 2/1: ids are exact
    assert _keys(select_problems(many, names=["relu"])) == ["1/3", "1/19"]  # name prefix without the id
    assert _keys(select_problems(many, names=["1_"])) == ["1/1", "2/1"]
    assert _keys(select_problems(many, start=2, names=["relu"])) == ["1/3", "1/19"]


def test_select_errors(many: list[Problem]) -> None:
    with pytest.raises(ProblemSourceError, match=r"no problem matches 'sofmax'; close matches: 1/23 \(23_Softmax\)"):
        select_problems(many, names=["sofmax"])
    with pytest.raises(ProblemSourceError, match="with ids in"):
        select_problems(many, start=20, names=["3_relu"])
    with pytest.raises(ProblemSourceError, match="start_problem 5 is after end_problem 2"):
        select_problems(many, start=5, end=2)


def test_split_deterministic_and_order_independent(many: list[Problem]) -> None:
    problems = builtin_problems() + [replace(p, level=p.level + 2) for p in many]
    train, test = split_problems(problems, 0.25, seed=0)
    assert len(test) == round(len(problems) * 0.25)
    assert not {p.key for p in train} & {p.key for p in test}
    assert sorted(_keys(train + test)) == sorted({p.key for p in problems})
    shuffled = problems[:]
    random.Random(7).shuffle(shuffled)
    again_train, again_test = split_problems(shuffled, 0.25, seed=0)
    assert _keys(again_train) == _keys(train) and _keys(again_test) == _keys(test)
    other_tests = {tuple(_keys(split_problems(problems, 0.25, seed=s)[1])) for s in range(1, 6)}
    assert any(set(t) != set(_keys(test)) for t in other_tests)


def test_split_edges(many: list[Problem]) -> None:
    train, test = split_problems(many, 0.0, seed=3)
    assert test == [] and _keys(train) == _keys(many)
    assert len(split_problems(many, 0.01, seed=3)[1]) == 1  # a positive fraction holds out at least one
    assert split_problems(many[:1], 0.5, seed=3) == (many[:1], [])  # never the only problem
    with pytest.raises(ProblemSourceError, match="test_fraction"):
        split_problems(many, 1.0, seed=0)
    with pytest.raises(ProblemSourceError, match="problem key 1/1 appears twice"):
        split_problems(many + builtin_problems(), 0.1, seed=0)


def test_find_problem_specs(many: list[Problem]) -> None:
    assert find_problem(many, "1/3").key == "1/3"
    assert find_problem(many, " 2 / 1 ").key == "2/1"
    assert find_problem(many, "3_relu").key == "1/3"
    assert find_problem(many, "SOFTMAX").key == "1/23"
    assert find_problem(many, "relu_big").key == "1/19"
    assert find_problem(many, "23").key == "1/23"
    with pytest.raises(ProblemSourceError, match=r"'3' names several problems: 1/3 \(3_ReLU\), 2/3 \(3_Conv_Add\)"):
        find_problem(many, "3")
    with pytest.raises(ProblemSourceError, match=r"no problem 1/99 among 6 problems from test"):
        find_problem(many, "1/99")
    with pytest.raises(ProblemSourceError, match=r"close matches: 1/23 \(23_Softmax\)"):
        find_problem(many, "softmx")


def test_problems_from_config() -> None:
    assert _keys(problems_from_config(DatasetConfig())) == [f"1/{i}" for i in range(1, 13)]
    cfg = DatasetConfig(source="builtin", level=[1, 2], start_problem=2, end_problem=3)
    assert _keys(problems_from_config(cfg)) == ["1/2", "1/3", "2/2", "2/3"]
    cfg = DatasetConfig(source="builtin", level=[1], problems=["relu", "1/9"])
    assert _keys(problems_from_config(cfg)) == ["1/3", "1/9"]  # "relu" is a prefix: LeakyReLU is not picked
    with pytest.raises(ProblemSourceError, match=r"no problems in source 'builtin' at level \[3\]"):
        problems_from_config(DatasetConfig(level=[3]))


# --- the command line ------------------------------------------------------------------------------

runner = CliRunner()


def test_cli_ls() -> None:
    result = runner.invoke(app, ["problems", "ls", "--level", "2"])
    assert result.exit_code == 0, result.output
    assert "1_Matmul_Bias_ReLU" in result.output and "3_ReLU" not in result.output
    result = runner.invoke(app, ["problems", "ls", "--json"])
    rows = json.loads(result.output)
    assert len(rows) == len(builtin_problems()) and all(r["has_solution"] for r in rows)
    assert rows[0] == {**rows[0], "key": "1/1", "level": 1, "problem_id": 1, "name": "1_Add", "source": "builtin"}


def test_cli_ls_other_source(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [_row(1, 19, "ReLU")])
    result = runner.invoke(app, ["problems", "ls", "--source", str(path), "--json"])
    assert result.exit_code == 0 and json.loads(result.output)[0]["has_solution"] is False


def test_cli_show() -> None:
    problem = find_problem(builtin_problems(), "1/3")
    result = runner.invoke(app, ["problems", "show", "1/3"])
    assert result.exit_code == 0 and result.output.strip() == problem.code.strip()
    result = runner.invoke(app, ["problems", "show", "relu", "--solution"])
    assert result.exit_code == 0 and "@triton.jit" in result.output and "class ModelNew" in result.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["problems", "show", "softmx"], "close matches: 1/9 (9_Softmax)"),
        (["problems", "ls", "--source", "nope"], "unknown problem source 'nope'"),
        (["problems", "show", "1/1", "--source", "hf"], "pip install datasets"),
    ],
)
def test_cli_errors(args: list[str], message: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "datasets", None)
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


def test_cli_show_solution_missing(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [_row(1, 19, "ReLU")])
    result = runner.invoke(app, ["problems", "show", "1/19", "--source", str(path), "--solution"])
    assert result.exit_code == 2 and "has no reference solution" in result.output
