"""`kforge train` end to end on the CPU: real generation (SmolLM2-135M), real sandboxed evaluation (Triton
interpreter), real LoRA updates; resume after kill -9; checkpoints that survive a kill mid-write."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kforge.runs.folder import RunFolder

pytestmark = pytest.mark.slow

# Small enough for a 2-core CI machine, large enough to take real steps: 2 problems x 2 samples x 2 turns.
COMMON = ["--preset", "tiny", "--plain", "rollout.max_tokens=48"]
COMPARED = ["reward/mean", "reward/max", "rate/format_ok", "rate/correct", "length/response_tokens/mean",
            "learner/loss", "turns/mean"]


def _train(runs_dir: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # A resumed run keeps its own config: --preset is refused there.
    common = [a for a in COMMON if a not in ("--preset", "tiny")] if "--resume" in args else COMMON
    return subprocess.run([sys.executable, "-m", "kforge", "train", "--runs-dir", str(runs_dir), *common, *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


def _by_step(run: RunFolder) -> dict[int, dict]:
    return {m["step"]: m for m in run.metrics()}


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """An uninterrupted 3-step run, used by several tests."""
    root = tmp_path_factory.mktemp("runs")
    out = _train(root, "--name", "ref", "--max-steps", "3", "log.save_every=1")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    return root, RunFolder(root / "ref"), out


def test_tiny_run_leaves_a_complete_run_folder(reference_run):
    root, run, out = reference_run
    assert run.read_status()["status"] == "finished"
    for name in ("config.yaml", "metrics.jsonl", "checkpoints.jsonl", "logs.log", "status.json",
                 "reward.png", "correctness.png", "speedup.png"):
        assert (run.path / name).exists(), name
    assert any((run.path / "tensorboard").iterdir())
    metrics = _by_step(run)
    assert sorted(metrics) == [1, 2, 3]
    for m in metrics.values():
        # Every step generated real tokens, evaluated them and took a learner step or said why not.
        assert m["length/response_tokens/mean"] > 0
        assert "rate/compiled" in m and "reward/mean" in m
        assert "learner/loss" in m or m.get("learner/skipped") == 1.0
    ckpts = run.checkpoints()
    assert ckpts[0]["reason"] == "start" and ckpts[-1]["reason"] == "end"
    last = run.path / ckpts[-1]["path"]
    assert (last / "trainer_state.json").exists()
    assert list(last.rglob("adapter_config.json")), "checkpoint holds no PEFT adapter"
    listing = subprocess.run([sys.executable, "-m", "kforge", "runs", "ls", "--runs-dir", str(root), "--json"],
                             capture_output=True, text=True, timeout=60)
    rows = {r["name"]: r for r in json.loads(listing.stdout)}
    assert rows["ref"]["status"] == "finished" and rows["ref"]["steps"] == 3


def test_plain_output_when_not_a_terminal(reference_run):
    _, _, out = reference_run
    assert "\x1b[" not in out.stdout  # no escape codes when stdout is a pipe
    assert re.search(r"step 3/3 \| .*reward", out.stdout), out.stdout[-2000:]
    assert "placement: no GPU visible" in out.stdout


def test_resume_after_kill_reproduces_the_uninterrupted_run(reference_run, tmp_path):
    _, ref, _ = reference_run
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "kforge", "train", "--runs-dir", str(tmp_path), *COMMON,
                             "--name", "cut", "--max-steps", "3", "log.save_every=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    run = RunFolder(tmp_path / "cut")
    deadline = time.time() + 900
    # Kill -9 once step 2 is logged (its checkpoint may or may not be complete: both must work).
    while time.time() < deadline and 2 not in _by_step(run) and proc.poll() is None:
        time.sleep(0.5)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert run.effective_status() == "crashed"
    resumed = _train(tmp_path, "--resume", "cut")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert run.read_status()["status"] == "finished"
    got, want = _by_step(run), _by_step(ref)
    assert sorted(got) == [1, 2, 3]
    for step in (1, 2, 3):
        for key in COMPARED:
            if key in want[step]:
                assert got[step][key] == pytest.approx(want[step][key], rel=1e-4, abs=1e-6), (step, key)


def test_kill_during_checkpoint_write_keeps_the_previous_one(reference_run, tmp_path):
    """A process rewriting checkpoints in a loop is killed at several moments; the newest complete
    checkpoint always loads."""
    _, ref, _ = reference_run
    script = tmp_path / "writer.py"
    script.write_text(
        "import sys, yaml\n"
        "from pathlib import Path\n"
        "from kforge.config.schema import KforgeConfig\n"
        "from kforge.learner.learner import Learner\n"
        "from kforge.rollout.base import sampling_from_config\n"
        "from kforge.runs.folder import RunFolder\n"
        "from kforge.train.trainer import Trainer, Parts\n"
        "from kforge.train.placement import Plan\n"
        "from kforge.problems import builtin_problems\n"
        "run = RunFolder(Path(sys.argv[1]))\n"
        "cfg = KforgeConfig.model_validate(yaml.safe_load(run.config_path.read_text()))\n"
        "learner = Learner(cfg, device='cpu', sampling=sampling_from_config(cfg))\n"
        "t = Trainer(cfg, run, Plan([]), builtin_problems()[:4], [], Parts(learner, None, None, True))\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    t.step += 1\n"
        "    t.save_checkpoint('scheduled')\n"
    )
    run = RunFolder.create(tmp_path, "ck", ref.config_path.read_text())
    for delay in (0.5, 1.3, 2.1):
        proc = subprocess.Popen([sys.executable, str(script), str(run.path)], stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    last = run.last_checkpoint()
    assert last is not None
    check = subprocess.run(
        [sys.executable, "-c",
         "import sys, yaml, json\n"
         "from pathlib import Path\n"
         "from kforge.config.schema import KforgeConfig\n"
         "from kforge.learner.learner import Learner\n"
         "from kforge.rollout.base import sampling_from_config\n"
         "ck = Path(sys.argv[2])\n"
         "cfg = KforgeConfig.model_validate(yaml.safe_load(Path(sys.argv[1]).read_text()))\n"
         "l = Learner(cfg, device='cpu', sampling=sampling_from_config(cfg)); l.load_checkpoint(str(ck / 'learner'))\n"
         "print(json.loads((ck / 'trainer_state.json').read_text())['step'])\n",
         str(run.config_path), str(run.path / last["path"])],
        capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stderr[-2000:]
    assert int(check.stdout.strip().splitlines()[-1]) == last["step"]


def test_dead_rollout_worker_is_restarted_and_the_step_retried(tmp_path):
    """A crashed vLLM worker answers every call with BackendError; the trainer builds a new backend, hands
    it the adapter the dead one had and redoes the step's rollouts."""
    import asyncio

    from fake_parts import DeadEngine
    from kforge.config.loader import resolve, to_yaml
    from kforge.evaluator import EvalPool
    from kforge.policy.runner import EpisodeRunner
    from kforge.problems import builtin_problems
    from kforge.rollout.base import BackendError
    from kforge.rollout.hf import HFBackend
    from kforge.train.placement import Plan
    from kforge.train.trainer import Parts, Trainer
    from tiny_models import make_learner

    cfg = resolve("tiny", overrides=["rollout.max_tokens=8", "dataset.group_size=1", "episode.max_turns=1"]).config
    learner = make_learner(cfg, device="cpu")
    fresh = HFBackend.from_model(learner.model, learner.tokenizer)
    dead = DeadEngine(tokenizer=learner.tokenizer)

    problems = builtin_problems()[:2]
    with EvalPool(cfg.evaluator) as pool:
        parts = Parts(learner, pool, EpisodeRunner.from_config(cfg, dead, pool.evaluate), shares_model=False)
        run = RunFolder.create(tmp_path, "r", to_yaml(cfg))
        trainer = Trainer(cfg, run, Plan([]), problems, [], parts)
        trainer._sync_adapter()  # as a run starts: the engine gets the learner's adapter (version 0)
        with pytest.raises(BackendError):  # without a way to restart, the failure is not hidden
            asyncio.run(trainer._rollouts(1, problems[:1]))
        parts.restart_backend = lambda: fresh
        loads, loads_at, load = [], [], fresh.load_adapter
        fresh.load_adapter = lambda path, version: (loads.append((Path(path).name, version)), loads_at.append(path),
                                                    load(path, version))[-1]
        rollouts = asyncio.run(trainer._rollouts(1, problems[:1]))
    assert dead.closed and trainer.restarts == 1 and parts.backend is fresh and parts.runner.backend is fresh
    assert len(rollouts.trajectories) == 1 and rollouts.trajectories[0].turns[0].response_ids
    # The new worker got the adapter, from the copy written for the dead one (in the stand-in for /dev/shm).
    assert loads == [("v000000", 0)] and Path(loads_at[0]).parent == trainer._copies.root
