"""What a person reads: off a terminal plain lines at a sane width, --help whole in a pipe, run names never
cut, a dashboard that ends on the step it finished and shows the optimiser's numbers, piped eval progress
that never goes quiet for long, and no library warning a user cannot act on."""

import os
import subprocess
import sys
import time
import warnings
from io import StringIO

import pytest
from rich.console import Console

from kforge.ui.dashboard import Dashboard
from locations import CANDIDATES


def kforge(*args, env=None):
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})


@pytest.mark.slow  # `kforge check` processes judging kernels
def test_piped_check_prints_key_value_lines_not_a_padded_panel(tmp_path):
    problem = tmp_path / "relu_problem.py"
    problem.write_text("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
                       "        return torch.relu(x)\ndef get_inputs():\n    return [torch.randn(8, 8)]\n"
                       "def get_init_inputs():\n    return []\n")
    res = kforge("check", str(CANDIDATES / "copy_kernel.py"), "--problem", str(problem), "--trials", "2")
    assert res.returncode == 1, res.stderr[-2000:]  # not correct: exit 1, so a script can gate on it
    lines = res.stdout.splitlines()
    assert "status: incorrect" in lines and any(line.startswith("trials: ") for line in lines)
    accepted = kforge("check", str(CANDIDATES / "relu_correct.py"), "--problem", str(problem), "--trials", "2")
    assert accepted.returncode == 0 and "status: correct" in accepted.stdout.splitlines(), accepted.stdout
    assert max(len(line) for line in lines) < 400 and not any(line.endswith(" ") for line in lines)
    code = "from kforge.ui.console import rule; rule('step 1')"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout == "--- step 1 ---\n"


def test_help_in_a_pipe_is_whole_and_every_json_flag_has_a_help_line():
    res = kforge("eval", "--help")
    assert res.returncode == 0 and "…" not in res.stdout
    assert "--candidates, --from-file" in res.stdout and "eval_results-TARGET-SPLIT.json" in res.stdout
    assert "JSON list of the runs" in kforge("runs", "ls", "--help").stdout
    assert "one JSON object" in kforge("runs", "show", "--help").stdout


@pytest.mark.slow  # `kforge` processes
def test_command_lists_in_help_show_each_summary_whole():
    """`-h` of the app and of each group listed its commands with summaries cut at 80 columns by "...": each
    is now whole (wrapped) in a pipe, and whole in Rich's boxes at 80 columns."""
    import typer

    from kforge.cli.app import app
    from kforge.cli.common import summary

    root = typer.main.get_command(app)
    for group in ([], ["runs"], ["problems"], ["rag"], ["config"]):
        command = root.commands[group[0]] if group else root
        for env in ({}, {"COLUMNS": "80"}):
            res = kforge(*group, "-h", env=env)
            assert res.returncode == 0 and "..." not in res.stdout.split("Commands")[-1] and "…" not in res.stdout
            flat = " ".join(part.strip(" │") for part in res.stdout.split("Commands")[-1].splitlines())
            flat = " ".join(flat.split()).replace("- ", "-")  # a line may end at a hyphen (syntax-/highlighted)
            for name, sub in command.commands.items():
                assert summary(sub) and " ".join(summary(sub).split()) in flat, (group, env, name, flat)


def test_runs_ls_never_cuts_a_run_name(tmp_path):
    from kforge.runs.folder import RunFolder

    name = "drkernel-20261126-123456"  # a default name, next to every other column filled
    run = RunFolder.create(tmp_path, name, "preset: drkernel\n")
    run.set_status("running", preset="drkernel")
    run.log_metrics({"step": 40, "reward/mean": 0.123456, "fast_1": 0.5})
    (run.path / "checkpoints" / "step_000040").mkdir(parents=True)
    run.log_checkpoint({"step": 40, "path": "checkpoints/step_000040"})
    run.set_status("finished")
    res = kforge("runs", "ls", "--runs-dir", str(tmp_path), env={"COLUMNS": "80"})
    assert res.returncode == 0 and name in res.stdout, res.stdout


def test_runs_ls_on_a_narrow_terminal_breaks_no_cell_and_says_what_it_left_out(tmp_path):
    """At 80 columns every cell wrapped mid-word (`finishe`/`d`): now each run is one line of whole cells,
    and the columns that did not fit are named under the table."""
    from kforge.runs.folder import RunFolder

    for name in ("drkernel-20261126-123456", "tiny-20261126-010101"):
        run = RunFolder.create(tmp_path, name, "preset: drkernel\n")
        run.log_metrics({"step": 40, "reward/mean": 0.123456, "fast_1": 0.5})
        (run.path / "checkpoints" / "step_000040").mkdir(parents=True)
        run.log_checkpoint({"step": 40, "path": "checkpoints/step_000040"})
        run.set_status("finished")
    for columns in (60, 80, 100):
        lines = kforge("runs", "ls", "--runs-dir", str(tmp_path), env={"COLUMNS": str(columns)}).stdout.splitlines()
        assert max(map(len, lines)) <= columns, lines
        rows = [line for line in lines if "-20261126-" in line]
        assert len(rows) == 2 and all("│ finished │" in row and "│ 40 " in row for row in rows), lines
        assert "left out at" in " ".join(lines[-2:]) and lines[-1].strip().endswith("(see --json)"), lines
        header = next(line for line in lines if "name" in line)
        assert "status" in header and "steps" in header and "last checkpoint" not in header
    wide = kforge("runs", "ls", "--runs-dir", str(tmp_path), env={"COLUMNS": "200"}).stdout
    assert "checkpoints/step_000040" in wide and "left out" not in wide


@pytest.mark.parametrize("name", ["学习率实验-一号-二号-三号",  # two cells a character: counted as one, the row was cut
                                  "drkernel-qwen3-8b-lr1e-5-kl0.01-group8-turns4-zero-shot-20261126-123456-retry"],
                         ids=["wide-characters", "long"])
def test_runs_ls_at_80_columns_shows_a_wide_or_long_name_with_its_status_and_no_cell_cut(tmp_path, name):
    """A name of wide characters was measured by its length, so Rich squeezed every cell (`finis…`); a name too
    long for the terminal beside its status cost the status column and was cropped at the edge. Each status
    is whole now, and the long name is laid out in its own parts (broken after a '-'), never cut inside one."""
    from rich.cells import cell_len

    from kforge.runs.folder import RunFolder

    names = sorted([name, "tiny-1"])
    for each in names:
        run = RunFolder.create(tmp_path, each, "preset: drkernel\n")
        run.log_metrics({"step": 40, "reward/mean": 0.123456, "fast_1": 0.5})
        run.set_status("finished")
    res = kforge("runs", "ls", "--runs-dir", str(tmp_path), env={"COLUMNS": "80"})
    lines = res.stdout.splitlines()
    assert res.returncode == 0 and max(map(cell_len, lines)) <= 80 and "…" not in res.stdout, res.stdout
    rows = [line.split("│")[1:-1] for line in lines if line.startswith("│")]
    assert [cells[1].strip() for cells in rows if cells[1].strip()] == ["finished", "finished"], res.stdout
    parts = [cells[0].strip() for cells in rows]
    assert "".join(parts) == "".join(names), res.stdout  # every name whole, top to bottom
    pieces = [part for part in parts if part not in names]  # the lines of a name laid out on several
    assert all(piece.endswith("-") for piece in pieces[:-1]), res.stdout


def test_wrapping_a_model_with_peft_prints_no_future_warning():
    from transformers import LlamaConfig, LlamaForCausalLM

    from kforge.config.loader import resolve
    from kforge.learner.lora import attach_lora

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(model, "is_gradient_checkpointing", None)  # what PEFT reads: transformers warns on it
    if not any("is_gradient_checkpointing" in str(w.message) for w in caught):
        return  # a transformers without the deprecation: nothing to silence
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        attach_lora(model, resolve("tiny").config)
    assert not [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]


def test_the_dashboard_ends_on_the_finished_step_with_the_optimisers_numbers():
    metrics = {"reward/mean": 0.5, "rate/correct": 0.25, "fast_1": 0.0, "learner/loss": 0.125, "learner/kl": 0.01,
               "learner/lr": 2e-5, "learner/grad_norm": 0.75}
    out = StringIO()
    with Dashboard(Console(file=out, width=200), "r", 3, "placement: cpu", live=False) as dash:
        dash.set_stage("learn", total=1)
        dash.end_step(1, metrics, 1.0)
    line = out.getvalue().strip().splitlines()[-1]
    assert "learn 0/1" not in line and "step 1 done" in line
    for label in ("loss 0.125", "kl 0.01", "lr 2e-05", "grad norm 0.75"):
        assert label in line, line
    live = StringIO()
    with Dashboard(Console(file=live, width=200, force_terminal=True), "r", 3, "p", live=True) as dash:
        dash.set_stage("learn", total=1)
        dash.end_step(1, metrics, 1.0)
    frame = live.getvalue()
    assert "learner/lr" in frame and "learner/grad_norm" in frame and "0/1" not in frame.split("step 1 done")[-1]


@pytest.mark.slow  # waits 2.5 s for a heartbeat
def test_piped_eval_progress_speaks_while_nothing_finishes(capsys):
    from kforge.cli.eval_cmd import _Heartbeat

    with _Heartbeat(enabled=True, every_s=1.0) as beat:
        beat.update("generate", 3, 40, say=False)
        time.sleep(2.5)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 2 and all(line.startswith("generate: 3/40 (") for line in lines), lines


@pytest.mark.slow  # several `kforge` processes
def test_brackets_in_printed_text_are_printed_as_they_are(tmp_path):
    """Rich markup would eat `[gpu]` of a fix and `[red]` of a run's name: every string kforge prints from a
    check, a file or the user is text."""
    from kforge.runs.folder import RunFolder

    res = kforge("doctor", "--preset", "tiny", "rollout.backend=vllm", "--runs-dir", str(tmp_path / "runs"))
    lines = res.stdout.splitlines()
    at = next((i for i, line in enumerate(lines) if "  package vllm: " in line), len(lines))
    vllm, rest = "".join(lines[at:at + 1]), lines[at + 1:]
    while rest and rest[0].startswith(" "):  # the row's wrapped lines and its fix
        vllm, rest = f"{vllm} {rest[0].strip()}", rest[1:]
    if "not installed" in vllm:  # vllm is not installed here: the row's fix names the extra
        assert "pip install 'kforge[gpu]'" in vllm, vllm
    assert "sandbox: [kernel]" in res.stdout  # the layer of each sandbox row
    run = RunFolder.create(tmp_path, "lr[red]", "preset: tiny\n")
    run.set_status("finished", preset="tiny")
    run.log_metrics({"step": 1, "reward/mean": 0.5})
    for env in ({}, {"COLUMNS": "200"}):
        listed = kforge("runs", "ls", "--runs-dir", str(tmp_path), env=env)
        assert listed.returncode == 0 and "lr[red]" in listed.stdout, listed.stdout
        shown = kforge("runs", "show", "lr[red]", "--runs-dir", str(tmp_path), env=env)
        assert shown.returncode == 0 and "run lr[red]" in shown.stdout and "[bold]" not in shown.stdout, shown.stdout
    out = StringIO()
    with Dashboard(Console(file=out, width=200, force_terminal=True), "lr[red]", 3, "p [dim]x", live=True) as dash:
        dash.kernel("1/3 [bold]", 1, "compile_error", "expected [int] got [red]")
        dash.warn("a [yellow] warning")
    frame = out.getvalue()
    for text in ("lr[red]", "p [dim]x", "1/3 [bold]", "expected [int] got [red]", "a [yellow] warning"):
        assert text in frame, (text, frame)
