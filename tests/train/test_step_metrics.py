"""Step metrics TRL users expect. Responses cut at max_tokens: the episode marks them, the step reports
their share, and `learner.drop_truncated` leaves them out of the loss (not out of their group's baseline).
Peak GPU memory of each role over a step."""

import pytest

from kforge.config.schema import LearnerConfig
from kforge.credit.advantages import assign_returns, build_samples
from kforge.credit.rewards import score_trajectories
from kforge.policy.prompts import PromptBuilder
from kforge.rollout.base import Completion
from kforge.train.metrics import rollout_metrics
from scripted_episodes import (
    KERNEL,
    NOT_A_MODEL,
    ScriptedBackend,
    answer,
    grade_by_parsing,
    make_cfg,
    run,
    smollm_tokenizer,
    three_problems,
)


@pytest.fixture(scope="module")
def tok():
    return smollm_tokenizer()


@pytest.fixture(scope="module")
def problems():
    return three_problems()


class CutBackend(ScriptedBackend):
    """Every other response is a kernel that ends on its own; the others run into max_tokens, as an engine
    reports it (finish_reason "length")."""

    calls = 0

    def _respond(self, prompt_ids) -> Completion:
        self.calls += 1
        cut = self.calls % 2 == 0
        reply = answer(NOT_A_MODEL if cut else KERNEL.format(s=1.0))
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return Completion(ids, reply, [-0.5] * len(ids), "length" if cut else "stop")


def test_truncated_turns_are_marked_reported_and_can_be_left_out(tok, problems):
    a = problems[0]
    backend = CutBackend(tok, problems, {})
    builder = PromptBuilder(tok, option="zero_shot")
    cfg = make_cfg(mode="single_turn")
    trajs = run(backend, builder, grade_by_parsing(), cfg, [(a, g) for g in range(4)])
    assert sorted(t.turns[0].truncated for t in trajs) == [False, False, True, True]

    metrics = rollout_metrics(trajs, {a.key: 1})
    assert metrics["rate/truncated"] == 0.5

    score_trajectories(trajs, cfg.reward, cfg.episode.thinking)  # credit is the one writer of scores
    assign_returns(trajs, 1.0)
    kept, _ = build_samples(trajs, LearnerConfig())
    assert len(kept) == 4
    trimmed, stats = build_samples(trajs, LearnerConfig(drop_truncated=True))
    assert len(trimmed) == 2 and stats["truncated_left_out"] == 2.0
    # The baseline still saw all four: the kept samples' advantages are those of the full group.
    assert sorted(s.advantage for s in trimmed) == sorted(s.advantage for s in kept if s.advantage > 0)


def test_peak_gpu_memory_per_role_over_a_step():
    """No GPU here: the readings nvidia-smi would give are the edge stood in for."""
    from kforge.gpus import Gpu
    from kforge.train.gpu import PeakMemory
    from kforge.train.placement import Plan

    readings = iter([[9.0, 30.0], [20.0, 31.0], [12.0, 30.5], [5.0, 5.0]])

    def query():
        used = next(readings)
        return [Gpu(str(i), f"GPU-{i}", "H100", 81559.0, mib * 1024, "550") for i, mib in enumerate(used)], "test"

    peaks = PeakMemory(Plan(["0", "1"], rollout=[1], learner=[0], eval=[0]), query=query)
    for _ in range(3):
        peaks.sample()  # during one step: the learner's backward pass peaks at 20 GB
    assert peaks.take() == {"gpu/learner/peak_mem_gb": 20.0, "gpu/eval/peak_mem_gb": 20.0,
                            "gpu/rollout/peak_mem_gb": 31.0}
    peaks.sample()
    assert peaks.take()["gpu/learner/peak_mem_gb"] == 5.0  # the next step starts over


def test_untimed_correct_kernels_log_no_fast_1_and_the_dashboard_says_not_measured(tok, problems):
    """On a CPU correct kernels are not timed: a fast_1 of 0 would be a number nobody measured."""
    from io import StringIO

    from rich.console import Console

    from kforge.train.metrics import held_out_metrics
    from kforge.ui.dashboard import Dashboard

    a = problems[0]
    cfg = make_cfg(mode="single_turn")
    builder = PromptBuilder(tok, option="zero_shot")
    script = {a.key: [answer(KERNEL.format(s=2.0))]}
    for meaningful in (False, True):
        trajs = run(ScriptedBackend(tok, problems, script), builder, grade_by_parsing(meaningful=meaningful), cfg,
                    [(a, g) for g in range(2)])
        metrics, held_out = rollout_metrics(trajs, {a.key: 1}), held_out_metrics(trajs, {a.key: 1})
        assert metrics["rate/correct"] == 1.0 and held_out["eval/correctness"] == 1.0
        if meaningful:  # timed on a GPU: the numbers are there
            assert metrics["fast_1"] == 1.0 and held_out["eval/fast_1.5"] == 1.0
        else:
            assert "fast_1" not in metrics and not any(k.startswith("eval/fast_1") for k in held_out)
            assert "eval/mean_speedup" not in held_out
            out = StringIO()
            with Dashboard(Console(file=out, width=200), "r", 3, "placement: cpu", live=False) as dash:
                dash.end_step(1, metrics, 1.0)
            assert "fast_1 not measured" in out.getvalue() and "fast_1 0.000" not in out.getvalue()
            live = StringIO()
            with Dashboard(Console(file=live, width=200, force_terminal=True), "r", 3, "p", live=True) as dash:
                dash.end_step(1, metrics, 1.0)
            assert "not measured" in live.getvalue()


def test_a_penalty_only_stretch_is_said_once_with_the_warm_start_as_the_way_out():
    """kevin's weights with a model that writes no gradable kernel: format errors score 0, flagged kernels -1,
    so the only non-zero component is the penalty. Said at the third such step, not again while it lasts;
    a step with any other credit ends the stretch."""
    from kforge.config.loader import resolve
    from kforge.evaluator.verdict import Status, Verdict
    from kforge.policy.records import Candidate, Trajectory, Turn
    from kforge.train.metrics import collapse_warnings

    cfg = resolve(preset="kevin").config

    def step_metrics(flagged: int, compiled: int = 0) -> dict:
        turns = []
        for i in range(4):
            verdict = None
            if i < flagged:
                verdict = Verdict(status=Status.INCORRECT, trials_passed=0, trials=5, flags=["reference_call"])
            elif i < flagged + compiled:
                verdict = Verdict(status=Status.CORRECT, trials_passed=5, trials=5)
            turns.append(Turn(0, [1], [2] * 5, "", [0.0] * 5, 0, candidate=Candidate("1/1", None), verdict=verdict))
        trajectories = [Trajectory("1/1", g, turns=[t]) for g, t in enumerate(turns)]
        score_trajectories(trajectories, cfg.reward, cfg.episode.thinking)
        return rollout_metrics(trajectories, {"1/1": 1})

    history, said = [], []
    for step, metrics in enumerate([step_metrics(1), step_metrics(2), step_metrics(1), step_metrics(3),
                                    step_metrics(1, compiled=1), step_metrics(1), step_metrics(1), step_metrics(2)], 1):
        for warning in collapse_warnings(history, metrics):
            if "penalty" in warning:
                said.append((step, warning))
        history = (history + [metrics])[-10:]
    assert [s for s, _ in said] == [3, 8]
    assert "kforge sft" in said[0][1] and "model.checkpoint" in said[0][1]


def test_a_step_without_a_correct_kernel_logs_no_fast_1_and_runs_ls_and_compare_say_dash(
        tok, problems, tmp_path):
    """Nothing timed (no correct kernel to time, as in a CPU run whose answers all fail): no fast_1 of 0 that no
    clock gave, so `runs ls` says `-`; and `eval compare` says `-` for a file whose speed was not measured."""
    import json

    from typer.testing import CliRunner

    from kforge.cli.app import app, compare_app
    from kforge.runs.folder import RunFolder

    a = problems[0]
    script = {a.key: [answer(NOT_A_MODEL)]}
    trajs = run(ScriptedBackend(tok, problems, script), PromptBuilder(tok, option="zero_shot"),
                grade_by_parsing(meaningful=False), make_cfg(mode="single_turn"), [(a, g) for g in range(2)])
    metrics = rollout_metrics(trajs, {a.key: 1})
    assert metrics["rate/correct"] == 0.0 and "fast_1" not in metrics
    folder = RunFolder.create(tmp_path / "runs", "cpu-run", "{}\n")
    folder.log_metrics({"step": 1, **metrics})
    folder.set_status("finished")
    listed = CliRunner().invoke(app, ["runs", "ls", "--runs-dir", str(tmp_path / "runs"), "--json"])
    assert json.loads(listed.stdout)[0]["fast_1"] is None
    table = CliRunner().invoke(app, ["runs", "ls", "--runs-dir", str(tmp_path / "runs")]).stdout.splitlines()
    head, row = ([c.strip() for c in next(ln for ln in table if word in ln).split("┃" if word == "fast_1" else "│")]
                 for word in ("fast_1", "cpu-run"))
    assert row[head.index("fast_1")] == "-", table
    untimed = {"correctness": 0.0, "fast_0": 0.0, "fast_1": 0.0, "timed": False}
    timed = {"correctness": 0.5, "fast_0": 0.5, "fast_1": 0.25, "timed": True}
    for name, summary in (("a.json", untimed), ("b.json", timed)):
        (tmp_path / name).write_text(json.dumps({"summary": {"overall": summary}, "samples": []}))
    res = CliRunner().invoke(compare_app, [str(tmp_path / "a.json"), str(tmp_path / "b.json")])
    fast_1 = [ln for ln in res.stdout.splitlines() if " fast_1 " in ln]
    assert res.exit_code == 0 and fast_1 and "0.000" not in fast_1[0] and "0.250" in fast_1[0], res.stdout
