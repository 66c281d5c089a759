"""Run folders: atomic status, append-only JSONL, crashed-run detection, `kforge runs ls`."""

import json
import os
import subprocess
import sys

from kforge.runs.folder import RunFolder, find_run
from kforge.space import atomic_write_text


def _finished_run(root, name="a"):
    run = RunFolder.create(root, name, "preset: tiny\n")
    run.set_status("running", preset="tiny")
    run.log_metrics({"step": 1, "reward/mean": 0.25})
    run.log_metrics({"step": 2, "reward/mean": 0.75, "fast_1": 0.5})
    (run.path / "checkpoints" / "step_000002").mkdir(parents=True)
    run.log_checkpoint({"step": 2, "path": "checkpoints/step_000002"})
    run.set_status("finished")
    return run


def test_summary_of_a_finished_run(tmp_path):
    run = _finished_run(tmp_path)
    s = run.summary()
    assert s["status"] == "finished" and s["steps"] == 2
    assert s["best_reward"] == 0.75 and s["fast_1"] == 0.5
    assert s["last_checkpoint"] == "checkpoints/step_000002"


def test_stale_running_status_shows_as_crashed(tmp_path):
    run = RunFolder.create(tmp_path, "dead", "{}\n")
    # A child process writes "running" with its own pid, then dies without a word.
    code = (
        "from kforge.runs.folder import RunFolder; from pathlib import Path; import sys;"
        "RunFolder(Path(sys.argv[1])).set_status('running')"
    )
    subprocess.run([sys.executable, "-c", code, str(run.path)], check=True)
    assert run.read_status()["status"] == "running"
    assert run.effective_status() == "crashed"
    live = RunFolder.create(tmp_path, "live", "{}\n")
    live.set_status("running")  # this process is alive
    assert live.effective_status() == "running"


def test_torn_jsonl_line_and_resumed_steps(tmp_path):
    run = _finished_run(tmp_path)
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 2, "reward/mean": 0.9}\n{"step": 3, "rew')  # resumed step 2, then a torn write
    metrics = run.metrics()
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[-1]["reward/mean"] == 0.9


def test_last_checkpoint_skips_missing_folders(tmp_path):
    run = _finished_run(tmp_path)
    run.log_checkpoint({"step": 3, "path": "checkpoints/step_000003"})  # never completed on disk
    assert run.last_checkpoint()["step"] == 2


def test_atomic_write_replaces_whole_file(tmp_path):
    p = tmp_path / "f.json"
    atomic_write_text(p, "old")
    atomic_write_text(p, "new")
    assert p.read_text() == "new"
    assert [x.name for x in tmp_path.iterdir()] == ["f.json"]


def test_create_refuses_existing_run(tmp_path):
    _finished_run(tmp_path)
    try:
        RunFolder.create(tmp_path, "a", "{}\n")
    except FileExistsError as exc:
        assert "--resume" in str(exc)
    else:
        raise AssertionError("an existing run folder was overwritten")


def test_a_start_stopped_before_its_first_step_with_wandb_on_frees_its_name(tmp_path):
    """W&B writes its own files into RUN/wandb/ (wandb.init(dir=the run folder)): that folder was taken for a
    file kforge did not write, and the name stayed blocked."""
    from kforge.runs.folder import written_by_run

    run = RunFolder.create(tmp_path, "r", "preset: tiny\n")
    (run.path / "wandb" / "run-20260101_000000-abc" / "files").mkdir(parents=True)
    (run.path / "wandb_id").write_text("abc")
    run.set_status("stopped", stopped_by="signal")
    assert written_by_run("wandb") and run.never_stepped()
    again = RunFolder.create(tmp_path, "r", "preset: tiny\n")
    assert sorted(p.name for p in again.path.iterdir()) == ["config.yaml", "status.json"]


def test_find_run_suggests(tmp_path):
    _finished_run(tmp_path, "alpha")
    assert find_run("alpha", tmp_path).name == "alpha"
    try:
        find_run("alpah", tmp_path)
    except FileNotFoundError as exc:
        assert "alpha" in str(exc)


def test_cli_runs_ls_lists_crashed_and_finished(tmp_path):
    _finished_run(tmp_path, "good")
    dead = RunFolder.create(tmp_path, "dead", "{}\n")
    subprocess.run([sys.executable, "-c",
                    "from kforge.runs.folder import RunFolder; from pathlib import Path; import sys;"
                    "RunFolder(Path(sys.argv[1])).set_status('running')", str(dead.path)], check=True)
    out = subprocess.run([sys.executable, "-m", "kforge", "runs", "ls", "--runs-dir", str(tmp_path), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = {r["name"]: r for r in json.loads(out.stdout)}
    assert rows["good"]["status"] == "finished" and rows["dead"]["status"] == "crashed"
    table = subprocess.run([sys.executable, "-m", "kforge", "runs", "ls", "--runs-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=60)
    assert "crashed" in table.stdout and "good" in table.stdout


def test_runs_show_says_where_the_config_came_from_and_times_as_dates(tmp_path, clean_env):
    import time

    from kforge.config.loader import resolve, to_yaml

    cfg = resolve("tiny", overrides=["dataset.batch_size=4", "log.run_name=r"]).config
    run = RunFolder.create(tmp_path, "r", to_yaml(cfg))
    run.set_status("running", preset="tiny")
    now = time.time()
    run.log_metrics({"step": 1, "reward/mean": 0.25, "time": now})
    run.set_status("finished")
    show = [sys.executable, "-m", "kforge", "runs", "show", "r", "--runs-dir", str(tmp_path)]
    out = subprocess.run(show, capture_output=True, text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    assert "preset tiny; changed: dataset.batch_size=4" in out.stdout
    assert "e+09" not in out.stdout and time.strftime("%Y-%m-%d %H:%M", time.localtime(now)) in out.stdout
    doc = json.loads(subprocess.run(show + ["--json"], capture_output=True, text=True, timeout=60).stdout)
    assert doc["config"]["preset"] == "tiny" and doc["config"]["changed"] == {"dataset.batch_size": 4}
