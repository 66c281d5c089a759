"""bench/learning_gpu.py's own parts: the curriculum it asks `kforge problems generate` for, the commands'
overrides (valid configs of the learn preset whose reward a template cannot game), where each arm runs, how
results and curves are read, and the tests it declares, as printed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import learning_gpu as lg
from kforge.config.loader import resolve


def test_the_curriculum_is_written_by_kforge_problems_generate_with_the_benchs_knobs(tmp_path: Path):
    args = lg.parse_args(["--out", str(tmp_path), "--train", "5", "--heldout", "2", "--rows", "4", "--cols", "64",
                          "--seed", "3"])
    argv = lg.generate_argv(args)
    assert argv[:2] == ["problems", "generate"] and "--verify" not in argv
    res = subprocess.run([sys.executable, "-m", "kforge", *argv], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(lg.REPO)})
    assert res.returncode == 0, res.stderr
    manifest = json.loads((tmp_path / "curriculum" / "curriculum.json").read_text())
    assert manifest["counts"] == {"train": 5, "test": 2}
    assert manifest["knobs"] | {"rows": 4, "cols": 64, "seed": 3} == manifest["knobs"]
    cpu = lg.parse_args(["--out", str(tmp_path), "--cpu", "--verify"])
    assert lg.generate_argv(cpu)[-2:] == ["--verify", "--cpu"]


@pytest.mark.parametrize("arm", list(lg.ARMS))
def test_every_command_resolves_on_the_learn_preset_and_its_reward_ranks_correct_first(arm: str, tmp_path: Path):
    args = lg.parse_args(["--out", str(tmp_path)])
    cfg = resolve(lg.PRESET, None, lg.common(args, tmp_path / "problems.jsonl") + [f"learner.learning_rate={args.lr}"]
                  + lg.ARMS[arm]).config
    assert cfg.reward.speed_weight == 0 and cfg.rollout.backend == "vllm" and cfg.episode.mode == "single_turn"
    assert cfg.learner.shuffle_advantages is (arm == "shuffled")
    assert (cfg.learner.learning_rate == 0) is (arm == "control")
    r = cfg.reward
    # an incorrect kernel's best (format, compile, full partial credit) stays far below a correct one's worst
    assert r.format_weight + r.compile_weight + r.partial_credit * r.correctness_weight < 0.5 * r.correctness_weight
    assert resolve(lg.PRESET, None, lg.common(lg.parse_args(["--out", "x", "--cpu"]), tmp_path)).config.rollout.backend == "hf"


def test_arms_go_round_robin_over_the_gpus_given_and_nowhere_on_the_cpu():
    args = lg.parse_args(["--out", "x", "--gpus", "0,1"])
    assert [lg.gpu_of(args, i) for i in range(3)] == [["--gpus", "0"], ["--gpus", "1"], ["--gpus", "0"]]
    assert lg.gpu_of(args, 1, train=True) == ["--gpus", "rollout=1 learner=1 eval=1"]
    assert lg.gpu_of(lg.parse_args(["--out", "x", "--cpu"]), 0) == []


def test_results_and_curves_are_read_from_kforge_files(tmp_path: Path):
    verdict = lambda status, flags=(): {"status": status, "flags": list(flags)}  # noqa: E731
    doc = {"samples": [{"problem_key": "1/20", "sample": 0, "verdict": verdict("correct")},
                       {"problem_key": "1/20", "sample": 1, "verdict": verdict("correct", ["pytorch_op"])},
                       {"problem_key": "1/20", "sample": 2, "verdict": None},
                       {"problem_key": "1/22", "sample": 0, "verdict": verdict("compile_error")}]}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert lg.outcomes(tmp_path / "r.json") == {("1/20", 0): "correct", ("1/20", 1): "incorrect",
                                                ("1/20", 2): "format", ("1/22", 0): "compile"}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rate/correct": s / 10}) + "\n" for s in (1, 2)))
    assert lg.curve(tmp_path) == {1: 0.1, 2: 0.2}


def test_the_declared_tests_leave_out_step_1_and_are_printed_per_control():
    steps = range(1, 25)
    curves = {"real": {s: 0.3 + 0.01 * s for s in steps}, "shuffled": {s: 0.3 for s in steps},
              "control": {s: 0.3 + 0.01 * s for s in steps}}
    tests = lg.curve_tests(curves)
    assert tests["shuffled"]["n"] == 23 and tests["shuffled"]["p"] < 0.01 and tests["control"]["p"] == 1.0
    requests = [(f"1/{p}", s) for p in range(1, 61) for s in range(4)]
    arms = {"real": {r: "correct" if i % 2 else "incorrect" for i, r in enumerate(requests)},
            "shuffled": {r: "correct" if i % 5 == 0 else "compile" for i, r in enumerate(requests)},
            "control": {r: "correct" if i % 2 else "format" for i, r in enumerate(requests)}}
    lines = lg.report_lines(lg.stats.heldout_report(arms), tests)
    assert "120/240" in lines[0] and any(line.startswith("real vs shuffled") and "p = " in line for line in lines)
    assert any(line.startswith("real vs control") and "McNemar one-sided p = 1" in line for line in lines)


def test_a_run_whose_start_failed_is_started_again_and_a_later_failure_stops_the_bench(tmp_path: Path, monkeypatch):
    """side_by_side with each `kforge train` replaced by a small script: `shuffled` fails at its first start
    (as an engine start disturbed by another process), `control` fails after its first step."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    calls: list[str] = []

    def fake_start(argv, log):
        arm = argv[0]
        calls.append(arm)
        d = runs / arm
        script = (f"import json, pathlib, time; d = pathlib.Path({str(d)!r}); d.mkdir(parents=True, exist_ok=True); "
                  "(d / 'status.json').write_text(json.dumps({'status': 'running'})); time.sleep(0.2); ")
        if arm == "shuffled" and calls.count(arm) == 1:
            script = "import sys; sys.exit(1)"
        elif arm == "control":
            script += "(d / 'metrics.jsonl').write_text('{}\\n'); raise SystemExit(1)"
        else:
            script += "(d / 'metrics.jsonl').write_text('{}\\n')"
        log.parent.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen([sys.executable, "-c", script])

    monkeypatch.setattr(lg, "start", fake_start)
    monkeypatch.setattr(lg.time, "sleep", lambda s: None if s > 1 else __import__("time").sleep(0.05))
    logs = {arm: tmp_path / "logs" / f"{arm}.out" for arm in lg.ARMS}
    with pytest.raises(SystemExit, match="train control failed"):
        lg.side_by_side({arm: [arm] for arm in lg.ARMS}, logs, runs, stagger_s=5.0)
    assert calls == ["real", "shuffled", "shuffled", "control"]  # control failed after a step: not redone


def test_resume_keeps_what_an_earlier_session_finished_and_continues_the_rest(tmp_path: Path, monkeypatch):
    """A device session ends mid-bench; its folder is carried to the next and the bench runs again with --resume.
    Kept: the curriculum (same knobs), the warm start, a complete gate and a complete eval, a finished run.
    Continued: a run with a checkpoint (`kforge train --resume`), a partial eval (`--resume`). Started: the rest."""
    out = tmp_path / "lg"
    args = ["--out", str(out), "--cpu", "--train", "5", "--heldout", "2", "--steps", "4", "--gate-samples", "2",
            "--eval-samples", "2", "--gate-low", "0", "--gate-high", "1"]
    parsed = lg.parse_args(args)
    (out / "curriculum").mkdir(parents=True)
    knobs = {k: getattr(parsed, k) for k in lg.CURRICULUM_KNOBS} | {"seed": 0}
    (out / "curriculum" / "curriculum.json").write_text(json.dumps({"knobs": knobs}))
    (out / "warm").mkdir()
    (out / "warm" / "sft.json").write_text(json.dumps({"epochs": []}))

    def results(n: int) -> str:
        return json.dumps({"samples": [{"problem_key": f"1/{i // 2}", "sample": i % 2,
                                        "verdict": {"status": "correct" if i % 2 else "incorrect", "flags": []}}
                                       for i in range(n)]})

    def metrics(run: Path, steps: int) -> None:
        run.mkdir(parents=True, exist_ok=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rate/correct": 0.5}) + "\n"
                                                   for s in range(1, steps + 1)))

    (out / "gate.json").write_text(results(4))
    runs = out / "runs"
    metrics(runs / "real", 4)
    (runs / "real" / "status.json").write_text(json.dumps({"status": "finished"}))
    metrics(runs / "shuffled", 2)
    (runs / "shuffled" / "checkpoints" / "step_000002").mkdir(parents=True)
    (out / "eval_real.json").write_text(results(4))
    (out / "eval_shuffled.json").write_text(results(1))
    launched: list[list[str]] = []

    class Done:
        returncode = 0

        def wait(self) -> int:
            return 0

        def poll(self) -> int:
            return 0

    def start(argv: list[str], log: Path) -> Done:
        launched.append(argv)
        if argv[0] == "eval":
            Path(argv[argv.index("--out") + 1]).write_text(results(4))
        if argv[0] == "train":
            run = Path(argv[argv.index("--resume") + 1]) if "--resume" in argv else runs / argv[argv.index("--name") + 1]
            metrics(run, 4)
        return Done()

    monkeypatch.setattr(lg, "start", start)
    assert lg.main(args + ["--resume"]) in (0, 1)
    trains = [a for a in launched if a[0] == "train"]
    evals = [a for a in launched if a[0] == "eval"]
    assert not [a for a in launched if a[0] in ("problems", "sft")]  # kept
    assert [a[:3] for a in trains] == [["train", "--resume", str(runs / "shuffled")], ["train", "--preset", "learn"]]
    assert "--name" in trains[1] and trains[1][trains[1].index("--name") + 1] == "control"
    assert [a[1] for a in evals] == [str(runs / "shuffled"), str(runs / "control")]  # the gate and real's: kept
    assert "--resume" in evals[0] and "--resume" not in evals[1]
    assert json.loads((out / "results.json").read_text())["heldout"]["arms"]["real"]["n"] == 4

    (out / "curriculum" / "curriculum.json").write_text(json.dumps({"knobs": knobs | {"depth": 9}}))
    with pytest.raises(SystemExit, match="other knobs"):
        lg.main(args + ["--resume"])
