"""Small things a new user hits: an empty --name, a preset given as a file, `runs rm` in a script, kforge's own
KFORGE_ROLE, PEFT's string forms of lora.target_modules, what a config key means, W&B's folder, a terminal
that is not UTF-8, and a huge candidate in a results file."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from kforge.config.loader import presets_dir, resolve


def kforge(*args, env=None, stdin=subprocess.DEVNULL, cwd=None):
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}, stdin=stdin, cwd=cwd)


def one_line_exit_2(res):
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:], res.stderr[-1000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


def test_an_empty_run_name_is_refused(tmp_path):
    line = one_line_exit_2(kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), "--name", ""))
    assert "--name is empty" in line and not (tmp_path / "runs").exists()


@pytest.mark.slow  # several `kforge` processes
def test_a_preset_file_of_the_users_is_a_preset_everywhere(tmp_path, clean_env):
    mine = tmp_path / "my-tiny.yaml"
    shutil.copy(presets_dir() / "tiny.yaml", mine)
    res = kforge("config", "show", "--preset", str(mine))
    assert res.returncode == 0, res.stderr
    assert resolve(str(mine)).config.model.name == resolve("tiny").config.model.name
    # train names the run after the file: PRESET-DATE-TIME is one folder name (this start then fails on its
    # missing problem file, after the run folder was made).
    res = kforge("train", "--preset", str(mine), "--runs-dir", str(tmp_path / "runs"), "--plain",
                 f"dataset.source={tmp_path / 'missing.jsonl'}")
    assert "one folder name" not in res.stderr and "missing.jsonl" in res.stderr
    assert [p.name.startswith("my-tiny-") for p in (tmp_path / "runs").iterdir()] == [True]
    assert "not found" in one_line_exit_2(kforge("config", "show", "--preset", str(tmp_path / "nope.yaml")))


def test_runs_rm_without_a_terminal_asks_for_yes(tmp_path):
    from kforge.runs.folder import RunFolder

    run = RunFolder.create(tmp_path, "r", "preset: tiny\n")
    run.set_status("finished")
    line = one_line_exit_2(kforge("runs", "rm", "r", "--runs-dir", str(tmp_path)))
    assert "--yes" in line and run.path.is_dir()
    assert kforge("runs", "rm", "r", "--runs-dir", str(tmp_path), "--yes").returncode == 0 and not run.path.exists()


def test_kforges_own_environment_variables_are_not_config_keys(clean_env):
    cfg = resolve("tiny", environ={"KFORGE_ROLE": "learner", "KFORGE_CPU_BF16": "1"}).config
    assert cfg == resolve("tiny", environ={}).config


def test_lora_target_modules_takes_peft_string_forms(clean_env):
    from transformers import LlamaConfig, LlamaForCausalLM

    from kforge.learner.lora import attach_lora

    assert resolve("tiny", overrides=["lora.target_modules=all-linear"]).config.lora.target_modules == "all-linear"
    assert resolve("tiny", overrides=["lora.target_modules=[q_proj,v_proj]"]).config.lora.target_modules == [
        "q_proj", "v_proj"]

    def adapted(targets):
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                             num_attention_heads=2, num_key_value_heads=2))
        cfg = resolve("tiny", overrides=[f"lora.target_modules={targets}"]).config
        peft = attach_lora(model, cfg)
        return {n.split(".")[-1] for n, m in peft.named_modules() if hasattr(m, "lora_A") and len(m.lora_A)}

    assert adapted("all-linear") == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert adapted(r".*\.(q_proj|down_proj)") == {"q_proj", "down_proj"}


def test_config_show_explains_a_key(clean_env):
    res = kforge("config", "show", "--preset", "tiny", "--explain", env={"COLUMNS": "300"})
    assert res.returncode == 0, res.stderr
    line = next(x for x in res.stdout.splitlines() if "placement.allow_cpu" in x)
    assert "wants a GPU" in line


def test_wandb_writes_its_files_into_the_run_folder(tmp_path, monkeypatch, clean_env):
    """wandb is not installed here: a module at that edge records what kforge asks of it."""
    from kforge.train.metrics import MetricSinks

    stub = tmp_path / "stub"
    stub.mkdir()
    (stub / "wandb.py").write_text(
        "calls = []\nclass Run:\n    id = 'abc'\n    def log(self, *a, **k): pass\n    def finish(self): pass\n"
        "def init(**kw):\n    calls.append(kw)\n    return Run()\n")
    monkeypatch.syspath_prepend(str(stub))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    import wandb

    run_path = tmp_path / "run"
    run_path.mkdir()
    cfg = resolve("tiny", overrides=["log.wandb_project=p", "log.tensorboard=false"]).config
    MetricSinks(str(run_path), cfg).close()
    assert wandb.calls[0]["dir"] == str(run_path)


def test_a_terminal_that_is_not_utf8_lists_unicode_run_names(tmp_path):
    from kforge.runs.folder import RunFolder

    RunFolder.create(tmp_path, "résumé-run", "preset: tiny\n").set_status("finished")
    res = kforge("runs", "ls", "--runs-dir", str(tmp_path), env={"PYTHONIOENCODING": "ascii", "LC_ALL": "C"})
    assert res.returncode == 0 and "Traceback" not in res.stderr, res.stderr[-2000:]
    assert "r\\xe9sum\\xe9-run" in res.stdout


@pytest.mark.slow  # evaluates through the pool
def test_a_huge_candidate_is_not_embedded_whole_in_the_results_file(tmp_path):
    from kforge.eval.runner import CODE_KEEP_CHARS
    from kforge.problems import builtin_problems

    relu = next(p for p in builtin_problems() if p.level == 1 and p.problem_id == 3)
    code = relu.solution + "\n# " + "x" * (4 * CODE_KEEP_CHARS) + "\n"
    cands = tmp_path / "cands.jsonl"
    cands.write_text(json.dumps({"problem": "1/3", "code": code}) + "\n")
    out = tmp_path / "res.json"
    res = kforge("eval", "--candidates", str(cands), "--source", "builtin", "--level", "1", "--problems", "3",
                 "--out", str(out))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert out.stat().st_size < 2 * CODE_KEEP_CHARS
    turn = json.loads(out.read_text())["samples"][0]["turns"][0]
    assert turn["code_cut"] and turn["code_chars"] == len(code) and code.startswith(turn["code"])
    assert len(turn["code_sha256"]) == 64


def test_ctrl_c_while_the_command_loads_is_exit_130_without_a_traceback(tmp_path):
    # Ctrl-C lands, deterministically, while kforge's modules import: a stand-in Typer raises it when loaded.
    (tmp_path / "typer").mkdir()
    (tmp_path / "typer" / "__init__.py").write_text("raise KeyboardInterrupt\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    res = kforge("runs", "ls", env={"PYTHONPATH": path})
    assert res.returncode == 130 and "Traceback" not in res.stderr, (res.returncode, res.stderr[-1000:])
