"""`kforge runs stop|logs|watch|tb|rm` against a real tiny training run and against stand-in processes."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request

import psutil
import pytest
import torch

from kforge.runs.folder import STOP_FILE, RunFolder

KFORGE = [sys.executable, "-m", "kforge"]
# The smallest real run: one problem per step, two samples, one turn, short answers and prompts.
TINY_FAST = ["dataset.batch_size=1", "dataset.group_size=2", "episode.max_turns=1", "rollout.max_tokens=16",
             "dataset.prompt_option=zero_shot", "log.save_every=0"]


def _ctrl_c_reaches_it() -> None:
    """In the child before exec: SIGINT back to its default. A suite run in the background (nohup, some CI
    jobs) starts with SIGINT ignored, a Python child then keeps ignoring it, and no Ctrl-C reached the command."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(*args, input=None):
    """The real `kforge` command line, in this process."""
    from typer.testing import CliRunner

    from kforge.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args], input=input)


def wait_for(predicate, timeout, what, poll=0.25):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(poll)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def stand_in(root, name, body):
    """A process that writes status "running" with its own pid for run `name`, then runs `body`."""
    RunFolder.create(root, name, "{}\n")
    code = textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        from pathlib import Path
        from kforge.runs.folder import RunFolder
        run = RunFolder(Path({str(root / name)!r}))
        run.set_status("running", step=3)
    """) + textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", code])
    run = RunFolder(root / name)
    wait_for(lambda: run.read_status().get("pid") == proc.pid, 60, "the stand-in to write its status")
    return proc, run


# ------------------------------------------------------------------------------------ a real training run


@pytest.mark.slow
def test_stop_logs_watch_on_a_real_training_run(tmp_path):
    runs = tmp_path / "runs"
    out = open(tmp_path / "train.out", "w")
    train = subprocess.Popen(KFORGE + ["train", "--preset", "tiny", "--name", "live", "--max-steps", "5",
                                       "--runs-dir", str(runs), "--plain", *TINY_FAST],
                             stdout=out, stderr=subprocess.STDOUT)
    run = RunFolder(runs / "live")
    followers = []
    try:
        wait_for(lambda: run.read_status().get("status") == "running", 300, "the run to start")
        assert run.effective_status() == "running"

        # rm never removes a running run.
        res = cli("runs", "rm", "live", "--yes", "--runs-dir", runs)
        assert res.exit_code == 1 and "stop it first" in res.stderr and run.path.is_dir()

        logs_f = subprocess.Popen(KFORGE + ["runs", "logs", "live", "-f", "--runs-dir", str(runs)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        watch = subprocess.Popen(KFORGE + ["runs", "watch", "live", "--interval", "0.5", "--runs-dir", str(runs)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        followers = [logs_f, watch]
        frame = cli("runs", "watch", "live", "--once", "--runs-dir", runs)
        assert frame.exit_code == 0 and "live" in frame.stdout and "running" in frame.stdout

        # Graceful stop: the STOP file; the run finishes its step, checkpoints and exits "stopped".
        res = cli("runs", "stop", "live", "--wait", "--timeout", "400", "--runs-dir", runs)
        assert res.exit_code == 0, res.output
        assert "stopped" in res.stdout
        assert train.wait(timeout=60) == 0
    finally:
        for p in [train, *followers]:
            if p.poll() is None:
                p.kill()
        out.close()

    status = run.read_status()
    assert status["status"] == "stopped" and run.effective_status() == "stopped"
    assert not (run.path / STOP_FILE).exists(), "a served stop request must not stop the next resume"
    step = status["step"]
    assert step >= 1 and max(m["step"] for m in run.metrics()) == step
    last = run.last_checkpoint()
    assert last["reason"] == "stop" and last["step"] == step
    ckpt = run.path / last["path"]
    assert json.loads((ckpt / "trainer_state.json").read_text())["step"] == step

    # The checkpoint loads back into kforge's learner (the resume path).
    from peft import get_peft_model_state_dict
    from safetensors.torch import load_file

    from kforge.ops.export import load_run_config
    from tiny_models import make_learner

    learner = make_learner(load_run_config(run), device="cpu")
    learner.load_checkpoint(ckpt / "learner")
    meta = json.loads((ckpt / "learner" / "meta.json").read_text())
    assert learner.version == meta["version"] and learner.optimizer_steps == meta["optimizer_steps"]
    saved = load_file(str(ckpt / "learner" / "adapter" / "adapter_model.safetensors"))
    current = get_peft_model_state_dict(learner.model)
    assert saved and set(saved) == set(current)
    assert all(torch.equal(saved[k], current[k].cpu()) for k in saved)

    # `logs -f` ended by itself when the run did, and saw lines written after it started.
    text, _ = logs_f.communicate(timeout=60)
    assert logs_f.returncode == 0
    assert "(stop)" in text and "loading the model" in text
    assert "(stop)" in cli("runs", "logs", "live", "--runs-dir", runs).stdout
    assert cli("runs", "logs", "live", "-n", "1", "--runs-dir", runs).stdout.count("\n") == 1

    # `watch` printed a plain line per change (not a terminal) and ended with the run.
    lines, _ = watch.communicate(timeout=60)
    lines = lines.strip().splitlines()
    assert watch.returncode == 0 and any("| running |" in ln for ln in lines)
    assert "| stopped |" in lines[-1] and f"step {step}/5" in lines[-1] and "reward" in lines[-1]
    final = cli("runs", "watch", "live", "--once", "--runs-dir", runs).stdout
    assert "stopped" in final and "reward" in final and "last checkpoint: checkpoints/step_" in final


# -------------------------------------------------------------------------------------- stand-in processes


def test_rm_refuses_a_running_run_then_asks(tmp_path):
    proc, run = stand_in(tmp_path, "busy", "time.sleep(120)")
    try:
        res = cli("runs", "rm", "busy", "--yes", "--runs-dir", tmp_path)
        assert res.exit_code == 1
        assert f"pid {proc.pid}" in res.stderr and "kforge runs stop busy" in res.stderr
        assert run.path.is_dir()
    finally:
        proc.kill()
        proc.wait()
    assert run.effective_status() == "crashed"
    res = cli("runs", "rm", "busy", "--runs-dir", tmp_path, input="n\n")
    assert res.exit_code == 1 and run.path.is_dir()
    res = cli("runs", "rm", "busy", "--runs-dir", tmp_path, input="y\n")
    assert res.exit_code == 0 and not run.path.exists()


@pytest.mark.slow  # a run that ignores SIGTERM, killed after its grace
def test_stop_now_kills_a_run_that_ignores_sigterm(tmp_path):
    body = """
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        Path(run.path / "child.pid").write_text(str(child.pid))
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        time.sleep(120)
    """
    proc, run = stand_in(tmp_path, "stuck", body)
    try:
        wait_for(lambda: (run.path / "child.pid").exists(), 30, "the child")
        child = int((run.path / "child.pid").read_text())
        started = time.monotonic()
        res = cli("runs", "stop", "stuck", "--now", "--grace", "1", "--runs-dir", tmp_path)
        assert res.exit_code == 0, res.output
        assert "killed" in res.stdout and time.monotonic() - started < 20
        proc.wait(timeout=10)  # its exit code went to `runs stop` (same process here), which reaped it
        assert not psutil.pid_exists(proc.pid)
        wait_for(lambda: not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE,
                 10, "the run's child to be killed too")
        status = run.read_status()
        assert status["status"] == "killed" and "resume" in status["note"]
    finally:
        if proc.poll() is None:
            proc.kill()


def test_stop_now_lets_sigterm_finish_gracefully(tmp_path):
    body = """
        def on_term(signum, frame):
            run.set_status("stopped", step=3)
            sys.exit(0)
        signal.signal(signal.SIGTERM, on_term)
        time.sleep(120)
    """
    proc, run = stand_in(tmp_path, "polite", body)
    try:
        res = cli("runs", "stop", "polite", "--now", "--grace", "30", "--runs-dir", tmp_path)
        assert res.exit_code == 0 and "stopped" in res.stdout
        proc.wait(timeout=10)
        assert run.read_status()["status"] == "stopped"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_start_killed_by_stop_now_while_the_model_loads_frees_its_name(tmp_path):
    """`runs stop --now` during start-up: SIGTERM ends the process before the loop can write its status, and
    the run read "killed", a status that blocked its name (refused, naming --resume, for a run that never
    stepped). While it lives, a second start under the name is told to stop it, not to --resume or rm it."""
    from kforge.runs.folder import RunFolderTaken

    code = textwrap.dedent(f"""
        import time
        from kforge.runs.folder import RunFolder
        run = RunFolder.create({str(tmp_path)!r}, "r", "preset: tiny\\n")
        run.log_path.write_text("loading the model\\n")
        time.sleep(120)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code])
    run = RunFolder(tmp_path / "r")
    try:
        wait_for(lambda: run.read_status().get("pid") == proc.pid and run.log_path.exists(), 60, "the start-up")
        with pytest.raises(RunFolderTaken) as live:
            RunFolder.create(tmp_path, "r", "preset: tiny\n")
        assert f"run r is starting at {run.path}: stop it first with `kforge runs stop {run.path}`" in str(live.value)
        assert "--resume" not in str(live.value) and "runs rm" not in str(live.value)
        res = cli("runs", "stop", "r", "--now", "--grace", "10", "--runs-dir", tmp_path)
        assert res.exit_code == 0 and run.read_status()["status"] == "killed", res.output
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    again = RunFolder.create(tmp_path, "r", "preset: tiny\n")
    assert again.read_status()["status"] == "starting" and not again.log_path.exists()


def test_stop_file_is_what_a_running_loop_sees(tmp_path):
    body = """
        while not run.stop_requested():
            time.sleep(0.1)
        run.set_status("stopped", step=4)
    """
    proc, run = stand_in(tmp_path, "loop", body)
    try:
        res = cli("runs", "stop", "loop", "--wait", "--timeout", "30", "--runs-dir", tmp_path)
        assert res.exit_code == 0 and "loop: stopped" in res.stdout
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    res = cli("runs", "stop", "loop", "--runs-dir", tmp_path)
    assert res.exit_code == 1 and "not running (status stopped)" in res.stderr
    assert cli("runs", "stop", "nope", "--runs-dir", tmp_path).exit_code == 2


def test_watch_once_and_logs_of_a_finished_run(tmp_path):
    run = RunFolder.create(tmp_path, "done", "{}\n")
    run.set_status("running", preset="tiny", total_steps=3)
    for step, reward in ((1, 0.1), (2, 0.4), (3, 0.3)):
        run.log_metrics({"step": step, "reward/mean": reward, "rate/correct": reward / 2, "learner/loss": -0.01 * step,
                         "time/step_s": 2.0})
    (run.path / "checkpoints" / "step_000003").mkdir(parents=True)
    run.log_checkpoint({"step": 3, "path": "checkpoints/step_000003"})
    run.log_path.write_text("line one\nline two\n")
    run.set_status("finished", step=3, total_steps=3)
    frame = cli("runs", "watch", "done", "--once", "--runs-dir", tmp_path).stdout
    # Off a terminal, `key: value` lines (as `check` prints), not a panel padded to the console's width.
    lines = frame.splitlines()
    for line in ("run: done", "status: finished", "step: 3/3", "preset: tiny", "reward: 0.3 (best 0.4)",
                 "loss: -0.03", "last checkpoint: checkpoints/step_000003", "log: line two"):
        assert line in lines, (line, lines)
    piped = subprocess.run(KFORGE + ["runs", "watch", "done", "--once", "--runs-dir", str(tmp_path)],
                           capture_output=True, text=True, timeout=120)
    assert piped.returncode == 0 and piped.stdout.splitlines() == lines, piped.stdout
    assert max(map(len, lines)) < 100 and not any(line.endswith(" ") for line in lines)
    plain = cli("runs", "watch", "done", "--runs-dir", tmp_path).stdout.strip().splitlines()
    assert len(plain) == 1 and "| finished |" in plain[0] and "reward 0.300" in plain[0]
    assert cli("runs", "logs", "done", "-f", "--runs-dir", tmp_path).stdout == "line one\nline two\n"
    assert cli("runs", "logs", "done", "-n", "1", "--runs-dir", tmp_path).stdout == "line two\n"


def _tb_run(root, name):
    from torch.utils.tensorboard import SummaryWriter

    run = RunFolder.create(root, name, "{}\n")
    run.set_status("finished")
    writer = SummaryWriter(str(run.path / "tensorboard"))
    for step in range(3):
        writer.add_scalar("reward/mean", 0.1 * step, step)
    writer.close()
    return run


@pytest.mark.slow
def test_tb_serves_the_runs(tmp_path):
    pytest.importorskip("tensorboard")
    _tb_run(tmp_path, "alpha")
    _tb_run(tmp_path, "beta")
    RunFolder.create(tmp_path, "no_tb", "{}\n").set_status("finished")
    proc = subprocess.Popen(KFORGE + ["runs", "tb", "--runs-dir", str(tmp_path), "--port", "6123"],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline()
        assert "alpha, beta" in first and "http://localhost:" in first
        url = first.split("at ", 1)[1].strip()
        children = psutil.Process(proc.pid).children(recursive=True)

        def served():
            try:
                with urllib.request.urlopen(url + "data/runs", timeout=2) as resp:
                    return {"alpha/.", "beta/."} <= set(json.loads(resp.read()))
            except OSError:
                return False

        wait_for(served, 90, "TensorBoard to answer")
        proc.send_signal(signal.SIGTERM)  # e.g. the SSH session closed: TensorBoard must not be left behind
        assert proc.wait(timeout=30) == 143  # 128 + SIGTERM, as a shell reports it
        wait_for(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children), 30,
                 "TensorBoard to exit with the command")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_tb_without_tensorboard_or_logs(tmp_path, monkeypatch):
    _tb_run(tmp_path, "alpha")
    RunFolder.create(tmp_path, "plain", "{}\n").set_status("finished")
    res = cli("runs", "tb", "plain", "--runs-dir", tmp_path)
    assert res.exit_code == 1 and "no tensorboard/ folder in plain" in res.stderr
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # what an environment without it looks like
    res = cli("runs", "tb", "--runs-dir", tmp_path)
    assert res.exit_code == 1 and "tensorboard is not installed" in res.stderr and "pip install" in res.stderr


@pytest.mark.slow  # `kforge runs tb` processes
def test_ctrl_c_ends_tb_with_130_and_sigterm_with_143_and_tensorboard_with_it(tmp_path):
    """`runs tb` ended on Ctrl-C with exit 0: 130 as every command, 143 for SIGTERM, and TensorBoard stops with
    it either way. TensorBoard here is a stand-in `tensorboard.main` that writes its pid and waits."""
    fake = tmp_path / "fake" / "tensorboard"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    pids = tmp_path / "tb.pids"
    (fake / "main.py").write_text(f"import os, time\nwith open({str(pids)!r}, 'a') as fh:\n"
                                  "    fh.write(f'{os.getpid()}\\n')\ntime.sleep(120)\n")
    (RunFolder.create(tmp_path / "runs", "alpha", "{}\n").path / "tensorboard").mkdir()
    path = os.pathsep.join(filter(None, [str(fake.parent), os.environ.get("PYTHONPATH")]))

    def ended_by(sig) -> int:
        started = len(pids.read_text().split()) if pids.exists() else 0
        proc = subprocess.Popen(KFORGE + ["runs", "tb", "--runs-dir", str(tmp_path / "runs")], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": path},
                                preexec_fn=_ctrl_c_reaches_it)
        try:
            wait_for(lambda: pids.exists() and len(pids.read_text().split()) > started, 60, "the stand-in to start")
            board = psutil.Process(int(pids.read_text().split()[-1]))
            proc.send_signal(sig)
            code = proc.wait(timeout=30)
            wait_for(lambda: not board.is_running() or board.status() == psutil.STATUS_ZOMBIE, 30,
                     "TensorBoard to stop with the command")
            return code
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    assert ended_by(signal.SIGINT) == 130
    assert ended_by(signal.SIGTERM) == 143


def test_stop_and_rm_need_an_existing_run(tmp_path):
    os.makedirs(tmp_path / "runs")
    for args in (("stop", "ghost"), ("rm", "ghost", "--yes"), ("logs", "ghost"), ("watch", "ghost", "--once")):
        res = cli("runs", *args, "--runs-dir", tmp_path / "runs")
        assert res.exit_code == 2 and "no run 'ghost'" in res.stderr


def test_stop_now_signals_only_the_process_that_started_when_the_run_says(tmp_path):
    """A run folder copied from another machine with the same host name: its pid is some other process here."""
    import socket

    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        run = RunFolder.create(tmp_path, "copied", "{}\n")
        born = psutil.Process(other.pid).create_time()
        for recorded in (born + 3600, born - 3600, None):
            status = {"status": "running", "pid": other.pid, "host": socket.gethostname(), "started": born}
            if recorded is not None:
                status["pid_started"] = recorded
            (run.path / "status.json").write_text(json.dumps(status))
            res = cli("runs", "stop", "copied", "--now", "--grace", "1", "--runs-dir", tmp_path)
            assert res.exit_code == 1, res.output
            assert ("not running" if recorded is not None else "not when that process started") in res.stderr
            assert other.poll() is None, "an unrelated process was signalled"
        assert run.effective_status() == "running"  # no start time recorded: the pid alone cannot be judged
        status["pid_started"] = born + 3600
        (run.path / "status.json").write_text(json.dumps(status))
        assert run.effective_status() == "crashed"
    finally:
        other.kill()
        other.wait()


def test_ctrl_c_ends_logs_follow_with_130_and_sigterm_ends_a_run_with_143(tmp_path):
    """Ctrl-C is exit 130 for every command (`runs logs -f` ended on 0); a run stopped by SIGTERM exits 143,
    128 + the signal, as a shell reports it (it said 130)."""
    from kforge.train import stopflag

    proc, run = stand_in(tmp_path, "alive", "time.sleep(120)")
    run.log_path.write_text("first line\n")
    follower = subprocess.Popen(KFORGE + ["runs", "logs", "alive", "-f", "--runs-dir", str(tmp_path)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_reaches_it)
    try:
        assert follower.stdout.readline() == "first line\n"
        with open(run.log_path, "a") as fh:
            fh.write("second line\n")
        assert follower.stdout.readline() == "second line\n"  # followed: Ctrl-C comes inside the follow loop
        follower.send_signal(signal.SIGINT)
        assert follower.wait(timeout=30) == 130, follower.stderr.read()
    finally:
        for p in (follower, proc):
            if p.poll() is None:
                p.kill()
        proc.wait()
    flag, before = stopflag.StopFlag(), signal.getsignal(signal.SIGTERM)
    stopflag.received.clear()
    flag.install()
    try:
        os.kill(os.getpid(), signal.SIGTERM)  # the first signal asks the loop to stop after its step
        assert flag.requested and stopflag.exit_code() == 143
    finally:
        flag.restore()
        stopflag.received.clear()
    assert signal.getsignal(signal.SIGTERM) is before  # restored, not left to a finished run's flag
    assert stopflag.exit_code() == 130


@pytest.mark.slow  # `kforge` processes
def test_logs_follow_a_resume_while_it_starts_up(tmp_path):
    """A resume keeps the status its run ended with until its loop starts (the model loads first): `logs -f`
    started then exited at once on "stopped". The resume records "starting" with its pid as it opens the
    folder, so `logs -f` follows it to its end, and a second resume is refused meanwhile."""
    from kforge.config.loader import resolve, to_yaml
    from kforge.errors import UserError
    from kforge.train.lifecycle import resume_target

    run = RunFolder.create(tmp_path, "again", to_yaml(resolve("tiny").config))
    run.log_metrics({"step": 1, "reward/mean": 0.5})
    run.set_status("stopped", step=1, stopped_by="stop file")
    code = textwrap.dedent(f"""
        import logging, time
        from kforge.train.lifecycle import open_run, resume_target
        target = resume_target({str(run.path)!r}, None, [])
        opened = open_run(target.resolved, target, print)
        log = logging.getLogger("kforge.train")
        log.setLevel(logging.INFO)
        log.info("loading the model")
        time.sleep(4)
        log.info("model loaded")
        opened.run.set_status("stopped", step=1)
    """)
    starter = subprocess.Popen([sys.executable, "-c", code])
    follower = None
    try:
        wait_for(lambda: run.log_path.exists() and "loading the model" in run.log_path.read_text(), 60,
                 "the resume to open its folder")
        assert run.effective_status() == "starting" and run.read_status()["pid"] == starter.pid
        with pytest.raises(UserError, match="still starting"):
            resume_target(str(run.path), None, [])
        follower = subprocess.Popen(KFORGE + ["runs", "logs", "again", "-f", "--runs-dir", str(tmp_path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0, err
        assert "loading the model" in out and "model loaded" in out, out  # followed to the resume's end
        assert starter.wait(timeout=30) == 0 and run.effective_status() == "stopped"
    finally:
        for p in (follower, starter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.slow  # `kforge` processes
def test_logs_follow_a_resume_through_its_pre_flight(tmp_path):
    """`kforge train --resume` asks the hub and reads the model's config (its pre-flight, seconds) before it
    opens the run folder: `logs -f` started then exited at once, the run still "stopped". The resume is
    "starting", with its pid, from its first check on: followed to its end, and a second resume refused."""
    from kforge.config.loader import resolve, to_yaml
    from kforge.errors import UserError
    from kforge.train.lifecycle import resume_target

    run = RunFolder.create(tmp_path, "again", to_yaml(resolve("tiny").config))
    run.log_metrics({"step": 1, "reward/mean": 0.5})
    run.set_status("stopped", step=1, stopped_by="stop file")
    run.log_path.write_text("the last start's last line\n")
    held, go = tmp_path / "in_pre_flight", tmp_path / "go"
    code = textwrap.dedent(f"""
        import logging, time
        from pathlib import Path
        import kforge.cli.train as train
        import kforge.train.lifecycle as lifecycle
        from kforge.cli.app import main

        def pre_flight(cfg, runs_dir):  # the hub asked, the model's files read: held until the test says go
            Path({str(held)!r}).touch()
            while not Path({str(go)!r}).exists():
                time.sleep(0.1)

        def drive(opened, plan, watch):  # the model loads, and the loop finds the stop file at once
            logging.getLogger("kforge.train").info("model loaded")
            opened.run.set_status("stopped", step=1)
            return lifecycle.Outcome("stopped", 1)

        train._preflight, train.fit_context, lifecycle.drive = pre_flight, lambda resolved, say: resolved, drive
        main(["train", "--resume", {str(run.path)!r}, "--plain"])
    """)
    starter = subprocess.Popen([sys.executable, "-c", code])
    follower = None
    try:
        wait_for(held.exists, 60, "the resume to reach its pre-flight")
        follower = subprocess.Popen(KFORGE + ["runs", "logs", "again", "-f", "--runs-dir", str(tmp_path)],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert follower.stdout.readline() == "the last start's last line\n"
        time.sleep(2)  # well past the follow's first look at the run
        assert follower.poll() is None, follower.communicate()  # still following the resume, not gone on "stopped"
        assert run.effective_status() == "starting" and run.read_status()["pid"] == starter.pid
        with pytest.raises(UserError, match="still starting"):
            resume_target(str(run.path), None, [])
        go.touch()
        out, err = follower.communicate(timeout=60)
        assert follower.returncode == 0 and "model loaded" in out, (out, err)  # followed to the resume's end
        assert starter.wait(timeout=30) == 0 and run.effective_status() == "stopped"
    finally:
        go.touch()
        for p in (follower, starter):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_ctrl_c_ends_watch_with_130(tmp_path):
    """`runs watch` ended on Ctrl-C with exit 0; 130 as every command (the README says so for all of them)."""
    proc, run = stand_in(tmp_path, "watched", "time.sleep(120)")
    watcher = subprocess.Popen(KFORGE + ["runs", "watch", "watched", "--interval", "0.2", "--runs-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_ctrl_c_reaches_it)
    try:
        assert "| running |" in watcher.stdout.readline()  # a plain line per change: the loop is polling
        watcher.send_signal(signal.SIGINT)
        assert watcher.wait(timeout=30) == 130, watcher.stderr.read()
    finally:
        for p in (watcher, proc):
            if p.poll() is None:
                p.kill()
        proc.wait()
