"""One pre-flight for `train` and `doctor`: what would make a run fail after its set-up (a model neither cached
nor reachable, a missing RAG index, W&B without credentials, a GPU config on a machine without one, a folder
that cannot be written) stops `train` in one line before a run folder exists, and doctor fails the same row.
Every `train` here ends before a problem or model loads."""

import json
import os
import subprocess
import sys

import pytest

from kforge.config.loader import resolve
from kforge.gpus import query_gpus, visible_records

NO_GPU = not visible_records(query_gpus()[0] or [])


def kforge(*args, env=None, drop=(), timeout=300):
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    for key in drop:
        full_env.pop(key, None)
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True,
                          timeout=timeout, env=full_env)


def one_line_exit_2(res):
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:], res.stderr[-1000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def fake_wandb(tmp_path):
    """wandb is not installed here: a package of that name stands in for it, raising what wandb raises
    without credentials, so the only way past it is the pre-flight refusing first."""
    pkg = tmp_path / "site" / "wandb"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("def init(**kwargs):\n    raise RuntimeError('api_key not configured (no-tty)')\n")
    return tmp_path / "site"


def _cases(tmp_path):
    (tmp_path / "a_file").write_text("not a folder")
    site = fake_wandb(tmp_path)
    home = tmp_path / "home"
    home.mkdir()
    wandb_env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]), "HOME": str(home)}
    return {
        "model": (["model.name=kforge-test-org/no-such-model"], {}, "kforge-test-org/no-such-model"),
        "rag index": (["dataset.prompt_option=raicl", f"dataset.rag_index_path={tmp_path / 'no_index'}"], {},
                      "kforge rag build"),
        "folder log.runs_dir": ([], {}, "is a file, not a folder"),
        "wandb": (["log.wandb_project=p"], wandb_env, "wandb login"),
    }


@pytest.mark.parametrize("case", ["model", "rag index", "folder log.runs_dir", "wandb"])
def test_train_refuses_in_one_line_before_making_a_run_folder(tmp_path, case):
    overrides, env, expect = _cases(tmp_path)[case]
    runs = tmp_path / ("a_file" if case == "folder log.runs_dir" else "") / "runs"
    res = kforge("train", "--preset", "tiny", "--runs-dir", str(runs), "--name", "r", "--plain",
                 *overrides, env=env, drop=("WANDB_API_KEY", "WANDB_MODE", "NETRC"), timeout=60)
    line = one_line_exit_2(res)
    assert line.startswith(f"error: {case}: ") and expect in line, line
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow  # `kforge doctor` and `kforge train` processes
def test_doctor_fails_the_rows_train_refuses(tmp_path):
    cases = _cases(tmp_path)
    overrides = [o for case in cases.values() for o in case[0]]
    res = kforge("doctor", "--preset", "tiny", "--json", "--runs-dir", str(tmp_path / "a_file" / "runs"), *overrides,
                 env=cases["wandb"][1],
                 drop=("WANDB_API_KEY", "WANDB_MODE", "NETRC"))
    assert res.returncode == 1, res.stderr[-2000:]
    failed = {r["check"] for r in json.loads(res.stdout) if r["status"] == "fail"}
    assert set(cases) <= failed, failed


@pytest.mark.skipif(not NO_GPU, reason="a machine without a GPU")
@pytest.mark.slow  # `kforge train` processes
def test_a_gpu_preset_on_a_machine_without_one_is_refused_unless_allowed(tmp_path):
    args = ("train", "--preset", "kevin", "--runs-dir", str(tmp_path / "runs"), "--plain",
            "model.name=kforge-test-org/no-such-model")
    line = one_line_exit_2(kforge(*args, timeout=60))
    assert line.startswith("error: gpus: ") and "measure_performance" in line and "--allow-cpu" in line
    # Allowed, the GPU row is only a warning: the next refusal is the (uncached, offline) model's.
    line = one_line_exit_2(kforge(*args, "--allow-cpu", timeout=60))
    assert line.startswith("error: model: ")
    # What cannot run on a CPU at all is refused even when allowed.
    line = one_line_exit_2(kforge(*args, "--allow-cpu", "rollout.backend=vllm", timeout=60))
    assert line.startswith("error: gpus: ") and "rollout.backend=vllm" in line
    assert not (tmp_path / "runs").exists()


def test_an_unreachable_hub_is_asked_once_and_fails_an_uncached_model_at_once(tmp_path):
    env = {"HF_ENDPOINT": "https://kforge-no-such-host.invalid", "HF_HOME": str(tmp_path / "hf")}
    res = kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), "--plain",
                 "model.name=kforge-test-org/no-such-model", env=env, drop=("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"),
                 timeout=60)
    line = one_line_exit_2(res)
    assert "kforge-no-such-host.invalid cannot be reached" in line and "Retry" not in res.stdout + res.stderr
    assert not (tmp_path / "runs").exists()


def test_an_unreachable_hub_sends_later_loads_to_the_cache(monkeypatch):
    import huggingface_hub.constants as constants

    from kforge.problems import hub

    for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", "https://kforge-no-such-host.invalid")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    hub.hub_unreachable.cache_clear()
    try:
        assert "cannot be reached" in hub.offline_unless_reachable()
        assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True
        assert hub.offline_unless_reachable() is None  # offline now: nothing more to say
    finally:
        hub.hub_unreachable.cache_clear()


def test_wandb_credentials_are_looked_up_where_wandb_looks(tmp_path, monkeypatch):
    from kforge.ops.preflight import check_wandb

    for var in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_DISABLED", "NETRC", "WANDB_CONFIG_DIR", "WANDB_BASE_URL",
                "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "wandb", raising=False)  # another test's stand-in may still be imported
    cfg = resolve("tiny", overrides=["log.wandb_project=p"]).config
    assert check_wandb(resolve("tiny").config)[0].status == "pass"  # not used
    row = check_wandb(cfg)[0]  # not installed: refused up front, not a whole run without W&B
    assert row.status == "fail" and "pip install 'kforge[wandb]'" in row.fix
    monkeypatch.syspath_prepend(str(fake_wandb(tmp_path)))
    row = check_wandb(cfg)[0]
    assert row.status == "fail" and "wandb login" in row.fix
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert check_wandb(cfg)[0].status == "pass"
    monkeypatch.delenv("WANDB_MODE")
    (tmp_path / ".netrc").write_text("machine api.wandb.ai\n  login user\n  password abc\n")
    (tmp_path / ".netrc").chmod(0o600)
    row = check_wandb(cfg)[0]
    assert row.status == "pass" and ".netrc" in row.detail
    (tmp_path / ".netrc").unlink()
    monkeypatch.setenv("WANDB_API_KEY", "k")
    assert check_wandb(cfg)[0].status == "pass"
