"""`kforge train --resume` on run folders that a crash or an old run left behind: a torn metrics line, a
damaged trainer state, a finished run. Set-up only: each resume ends before a model loads."""

import json
import os
import subprocess
import sys

import pytest

from kforge.config.loader import resolve, to_yaml
from kforge.runs.folder import RunFolder, append_jsonl


def _train(*args, env=None):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kforge", "train", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def _run(tmp_path, status="finished", steps=3, *overrides):
    cfg = resolve("tiny", overrides=list(overrides)).config
    run = RunFolder.create(tmp_path, "r", to_yaml(cfg))
    for step in range(1, steps + 1):
        run.log_metrics({"step": step, "reward/mean": 0.1 * step})
    for step in (0, steps):
        ckpt = run.path / "checkpoints" / f"step_{step:06d}"
        (ckpt / "learner").mkdir(parents=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "sampler": {}}))
        run.log_checkpoint({"step": step, "path": str(ckpt.relative_to(run.path))})
    run.set_status(status, step=steps, total_steps=steps)
    return run


def _snapshot(folder):
    return {str(p): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_torn_metrics_line_is_dropped_with_a_copy_and_appends_stay_whole(tmp_path):
    from kforge.runs.folder import drop_torn_line

    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    append_jsonl(path, {"step": 2})  # even before any repair, the new record is a line of its own
    lines = path.read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines if x.startswith('{"step": ') and x.endswith("}")] == [1, 2]
    path.write_text('{"step": 1}\n{"step": 2, "rew')
    assert drop_torn_line(path) == f"{path}.torn"
    assert path.read_text() == '{"step": 1}\n' and (tmp_path / "metrics.jsonl.torn").read_text() == '{"step": 2, "rew\n'
    assert drop_torn_line(path) is None


@pytest.mark.slow  # resumes through `kforge train`
def test_resume_after_a_torn_metrics_line_keeps_the_steps(tmp_path):
    run = _run(tmp_path, "failed", 2, f"dataset.source={tmp_path / 'gone.jsonl'}")
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "reward/me')
    res = _train("--resume", str(run.path), "--plain")
    assert "torn line" in res.stdout and (run.path / "metrics.jsonl.torn").exists()
    assert res.returncode == 2 and "gone.jsonl" in res.stderr  # the set-up then fails for its own reason
    run.log_metrics({"step": 3})
    assert [m["step"] for m in run.metrics()] == [1, 2, 3] and run.summary()["steps"] == 3


@pytest.mark.slow  # resumes through `kforge train`
def test_a_damaged_trainer_state_falls_back_to_the_previous_checkpoint(tmp_path):
    run = _run(tmp_path, "crashed", 3)
    (run.path / "checkpoints" / "step_000003" / "trainer_state.json").write_text('{"step": 3, "samp')
    assert run.last_checkpoint()["step"] == 0
    res = _train("--resume", str(run.path), "--plain", f"dataset.source={tmp_path / 'gone.jsonl'}")
    assert "step_000003/trainer_state.json is damaged" in res.stdout and "Traceback" not in res.stderr
    [line] = run.damaged_checkpoints()
    assert "step_000003/trainer_state.json is damaged" in line


def test_resuming_a_finished_run_writes_nothing(tmp_path):
    run = _run(tmp_path, "finished", 3)
    before = _snapshot(run.path)
    res = _train("--resume", str(run.path))
    assert res.returncode == 0, res.stderr
    assert "finished at step 3" in res.stdout and "--max-steps 6" in res.stdout
    assert _snapshot(run.path) == before


@pytest.mark.slow  # resumes through `kforge train`
def test_a_failed_extension_keeps_a_finished_run_finished(tmp_path):
    run = _run(tmp_path, "finished", 3, f"dataset.source={tmp_path / 'gone.jsonl'}")
    config = run.config_path.read_bytes()
    res = _train("--resume", str(run.path), "--max-steps", "5")
    assert res.returncode == 2 and "gone.jsonl" in res.stderr
    assert run.read_status()["status"] == "finished" and "error" not in run.read_status()
    assert run.config_path.read_bytes() == config  # the settings it tried are not left as the run's
    assert run.config_history() == []  # its set-up failed before the trainer was restored: nothing recorded


@pytest.mark.slow  # resumes through `kforge train`
def test_resume_refuses_another_config_preset_or_name_in_one_line(tmp_path):
    run = _run(tmp_path, "crashed", 2)
    before = _snapshot(run.path)
    for flag in (["--config", str(tmp_path / "no-such.yaml")], ["--preset", "kevin"]):
        res = _train("--resume", str(run.path), *flag)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stdout + res.stderr
        assert flag[0] in res.stderr and "key=value" in res.stderr
    res = _train("--resume", str(run.path), "--name", "other")  # the run keeps its name: not silently ignored
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stdout + res.stderr
    assert "drop --name other" in res.stderr and not (tmp_path / "other").exists()
    assert _snapshot(run.path) == before


def test_a_finished_run_with_nothing_to_do_is_untouched_whatever_the_overrides(tmp_path):
    run = _run(tmp_path, "finished", 3)
    before = _snapshot(run.path)
    for args in (["rollout.max_tokens=64"], ["--max-steps", "2", "learner.learning_rate=1e-3"]):
        res = _train("--resume", str(run.path), *args, env={"KFORGE_ROLLOUT__TEMPERATURE": "0.3"})
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert "finished at step 3" in res.stdout
    assert _snapshot(run.path) == before


@pytest.mark.slow  # resumes through `kforge train`
def test_a_resume_whose_set_up_fails_leaves_the_runs_settings_as_they_were(tmp_path):
    """Settings a resume changes are recorded once the trainer is restored from a checkpoint (the step they
    start after is known only then; tests/train/test_trainer.py records them): a set-up that fails first
    leaves config.yaml and config_history.jsonl as they were, so the next resume does not inherit them."""
    run = _run(tmp_path, "crashed", 2, f"dataset.source={tmp_path / 'gone.jsonl'}")
    was = run.config_path.read_bytes()
    res = _train("--resume", str(run.path), "rollout.max_tokens=64", env={"KFORGE_ROLLOUT__TOP_K": "5"})
    assert res.returncode == 2 and "gone.jsonl" in res.stderr  # the set-up fails for its own reason
    assert run.config_history() == [] and run.config_path.read_bytes() == was
    assert "changes rollout" not in (run.path / "logs.log").read_text()


def test_appends_after_a_whole_line_add_no_empty_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    for step in (1, 2, 3):
        append_jsonl(path, {"step": step})
    assert path.read_text() == '{"step": 1}\n{"step": 2}\n{"step": 3}\n'


def test_a_dry_run_resume_repairs_nothing(tmp_path):
    run = _run(tmp_path, "crashed", 2)
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 3, "reward/me')
    before = _snapshot(run.path)
    res = _train("--resume", str(run.path), "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "torn line" not in res.stdout and _snapshot(run.path) == before  # the repair waits for a real start


@pytest.mark.parametrize("damage", ["missing", "not_a_run", "not_yaml", "not_a_mapping", "bad_value"])
def test_resuming_a_folder_without_a_readable_config_yaml_names_the_folder_not_config(tmp_path, damage):
    """It said `--config: file .../config.yaml not found`, then `--config: .../config.yaml line 2 is not valid
    YAML`, an option the user never gave. A folder without config.yaml is said as eval says it (one helper):
    not a kforge run, or a damaged one; a damaged config.yaml as the run's config, naming the file."""
    run = _run(tmp_path, "stopped", 2)
    if damage in ("missing", "not_a_run"):
        run.config_path.unlink()
        if damage == "not_a_run":
            (run.path / "status.json").unlink()  # a folder that no run wrote: not found as a run either
    else:
        run.config_path.write_text({"not_yaml": "model: [\n", "not_a_mapping": "- 1\n",
                                    "bad_value": run.config_path.read_text() + "max_steps: -4\n"}[damage])
    res = _train("--resume", str(run.path), "--plain")
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    [line] = res.stderr.strip().splitlines()
    assert "--config" not in line, line
    if damage in ("missing", "not_a_run"):
        assert f"no config.yaml in {run.path}: not a kforge run, or a damaged one" in line, line
        from kforge.runs.locate import no_run_config

        assert f"{no_run_config(run)}; there is no config to resume with: put the run's config.yaml back" in line
    else:
        assert f"the run's config {run.config_path}" in line or f"the run's config: {run.config_path}" in line, line
        assert {"not_yaml": "line 2 is not valid YAML", "not_a_mapping": "must hold a mapping",
                "bad_value": "invalid value for max_steps"}[damage] in line


@pytest.mark.slow  # `kforge` processes
def test_a_resume_past_a_damaged_checkpoint_names_the_step_it_resumes_from(tmp_path):
    """Step 3's checkpoint damaged: the resume continues from step 2, and said "after step 3" (its warning,
    the logged changes and config_history.jsonl's after_step). The changes are recorded with the step the
    trainer is restored from, once it is (tests/train/test_trainer.py): here its set-up fails before."""
    run = _run(tmp_path, "crashed", 3)
    (run.path / "checkpoints.jsonl").unlink()
    for step in (0, 2, 3):  # recorded in the order a run writes them
        ckpt = run.path / "checkpoints" / f"step_{step:06d}"
        (ckpt / "learner").mkdir(parents=True, exist_ok=True)
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step, "sampler": {}}))
        run.log_checkpoint({"step": step, "path": str(ckpt.relative_to(run.path))})
    (run.path / "checkpoints" / "step_000003" / "trainer_state.json").write_text('{"step": 3, "samp')
    res = _train("--resume", str(run.path), "--plain", f"dataset.source={tmp_path / 'gone.jsonl'}")
    assert res.returncode == 2 and "gone.jsonl" in res.stderr  # the set-up fails after the folder is opened
    assert "step_000003/trainer_state.json is damaged (JSONDecodeError); resuming from step 2" in res.stdout, res.stdout
    assert "after step 3" not in res.stdout + res.stderr and run.config_history() == []


def test_a_resume_is_starting_through_its_pre_flight_and_a_refusal_there_puts_its_status_back(tmp_path, monkeypatch):
    """The resume said nothing in the run folder until it opened it, after its pre-flight: `runs logs -f`, `watch`
    and a second resume saw the status the run had ended with. It is "starting" with its pid from its first
    check on; a pre-flight that refuses it, or Ctrl-C there, leaves the status it found."""
    from typer.testing import CliRunner

    import kforge.cli.train as train
    from kforge.cli.app import app
    from kforge.ui.console import fail

    run = _run(tmp_path, "stopped", 2)
    before = run.read_status()
    seen = []

    def refused(cfg, runs_dir):
        seen.append(run.effective_status())
        raise fail("gpus: none found; pass --allow-cpu")

    def interrupted(cfg, runs_dir):
        seen.append(run.effective_status())
        raise KeyboardInterrupt

    for pre_flight in (refused, interrupted):
        monkeypatch.setattr(train, "_preflight", pre_flight)
        res = CliRunner().invoke(app, ["train", "--resume", str(run.path), "--plain"])
        assert res.exit_code != 0 and run.read_status() == before, res.output
    assert seen == ["starting", "starting"]
