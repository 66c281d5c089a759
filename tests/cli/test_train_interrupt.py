"""`kforge train` interrupted from the keyboard on the CPU: exit 130 and a clean status."""

import os
import signal
import subprocess
import sys
import time

import pytest

from kforge.runs.folder import RunFolder

pytestmark = pytest.mark.slow


def test_ctrl_c_twice_exits_130_and_leaves_no_error(tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kforge", "train", "--preset", "tiny", "--plain", "--runs-dir",
                             str(tmp_path), "--name", "c", "--max-steps", "3", "rollout.max_tokens=16"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    run = RunFolder(tmp_path / "c")
    deadline = time.time() + 600
    while time.time() < deadline and run.read_status().get("status") != "running" and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, proc.stdout.read()[-2000:]
    proc.send_signal(signal.SIGINT)  # once: finish the step, checkpoint, stop
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)  # twice: stop now
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 130, out[-3000:]
    status = run.read_status()
    assert status["status"] == "stopped" and status["stopped_by"] == "signal"
    assert "error" not in status, status
    assert out.count("placement:") == 1
