"""The live dashboard in a terminal: Live owns the screen. A log line while it runs is printed above it (and
written to the run's log), never under it where the next frame would leave the one before on screen; the
frame fits the terminal's height; a terminal that narrows leaves no old frame behind; a stage shows while
it runs and not after."""

import logging

from rich.console import Console
from rich.logging import RichHandler

from kforge.ui.dashboard import Dashboard
from vt import Terminal

METRICS = {"reward/mean": 0.5, "rate/correct": 0.25, "fast_1": 0.1, "speedup/mean": 1.2, "learner/loss": 0.125,
           "learner/kl": 0.01, "learner/lr": 2e-5, "learner/grad_norm": 0.75, "throughput/generate_tok_s": 90.0,
           "throughput/eval_kernels_min": 3.0, "learner/tokens_per_s": 40.0, "gpu/rollout/mem_used_gb": 10.0,
           "gpu/rollout/util_pct": 50, "gpu/learner/mem_used_gb": 20.0}


def _headers(lines: list[str]) -> int:
    return sum(line.startswith("kforge · r ") for line in lines)


def _step(dash: Dashboard, step: int, kernels: int = 8, warnings: int = 0) -> None:
    dash.set_stage("rollout + eval", kernels)
    for k in range(kernels):
        dash.advance()
        dash.kernel(f"1/{k}", 1, "correct", "x1.20")
    for w in range(warnings):
        dash.warn(f"warning {step}.{w}")
    dash.set_stage("learn")
    dash.end_step(step, METRICS, 1.0)
    dash._live.refresh()  # what Live's clock does twice a second


def test_a_log_line_during_the_dashboard_is_printed_above_it_and_into_the_log_file(tmp_path):
    term = Terminal(120, 40)  # stdout and stderr are the same terminal
    out = Console(file=term, force_terminal=True, width=120, height=40)
    err = Console(file=term, force_terminal=True, width=120, height=40, stderr=True)
    log = logging.getLogger("kforge.test_dashboard_terminal")
    log.propagate, log.level = False, logging.INFO
    ours = RichHandler(console=err, show_path=False, markup=False)  # kforge's handler on a terminal
    library = logging.StreamHandler(term)  # a library's, bound to the terminal before the dashboard began
    to_file = logging.FileHandler(tmp_path / "logs.log")
    for handler in (ours, library, to_file):
        log.addHandler(handler)
    try:
        with Dashboard(out, "r", 3, "placement: cpu") as dash:
            log.info("checkpoint step_000000 (start)")
            _step(dash, 1)
            log.warning("step 1: no response had a parsable block")
            log.info("step 1/3 reward 0.500")
            _step(dash, 2)
    finally:
        for handler in (ours, library, to_file):
            log.removeHandler(handler)
        to_file.close()
    lines = term.lines
    assert _headers(term.lines) == 1, "\n".join(lines)  # one frame: none left above it
    first = lines.index(next(line for line in lines if line.startswith("kforge · r ")))
    said = [i for i, line in enumerate(lines) if "step 1/3 reward 0.500" in line]
    assert len(said) == 2 and max(said) < first, "\n".join(lines)  # both handlers' lines, above the view
    assert "step 2 done" in "\n".join(lines[first:])
    assert "step 1/3 reward 0.500" in (tmp_path / "logs.log").read_text()
    assert ours.console is err and library.stream is term  # given back when the view ends


def test_the_frame_fits_the_terminal_and_keeps_the_newest_warning():
    term = Terminal(100, 24)
    out = Console(file=term, force_terminal=True, width=100, height=24)
    with Dashboard(out, "r", 3, "placement: split") as dash:
        for step in (1, 2, 3):
            _step(dash, step, warnings=2)
            frame = out.render_lines(dash._render(), out.options.update(height=None), pad=False)
            text = "\n".join("".join(seg.text for seg in line) for line in frame)
            assert len(frame) <= 24, text  # Live cuts a taller one at the bottom (the warnings) with "..."
            assert f"warning {step}.1" in text and "learner/grad_norm" in text
    assert _headers(term.lines) == 1, "\n".join(term.lines)
    assert "warning 3.1" in "\n".join(term.lines)


def test_a_narrowed_terminal_leaves_no_old_frame_behind():
    term = Terminal(120, 80)
    out = Console(file=term, force_terminal=True, width=120, height=80)
    with Dashboard(out, "r", 3, "placement: cpu") as dash:
        _step(dash, 1)
        term.resize(80, 80)  # the window narrows: the frame's full-width rows wrap onto two rows each
        out.size = (80, 80)
        _step(dash, 2)
    # The window shows one frame, as wide as it is now. (Rows that the narrowing pushed into the scroll-back
    # stay there: a terminal keeps its history.)
    screen = term.screen
    assert _headers(screen) == 1, "\n".join(screen)
    assert max(len(line) for line in screen) <= 80 and "step 2 done" in "\n".join(screen)


def test_a_stage_shows_while_it_runs_and_the_next_steps_rollouts_outlast_this_steps_end():
    def shown(dash: Dashboard) -> str:
        dash._plain_line(force=True)
        return out.file.getvalue().strip().splitlines()[-1]

    from io import StringIO

    out = Console(file=StringIO(), width=200)
    with Dashboard(out, "r", 3, "p", live=False) as dash:
        with dash.stage("learn"):
            assert "stage learn |" in shown(dash)  # the optimiser step reports no progress: no "0/1"
        assert "learn" not in shown(dash)
        # Pipelined: step 2's rollouts start while step 1 learns, and go on after step 1 ends.
        dash.set_stage("learn")
        dash.set_stage("rollout + eval", 8, step=2)
        dash.advance(3, stage="rollout + eval")
        assert "stage learn, rollout + eval 3/8 |" in shown(dash)
        dash.end_step(1, METRICS, 1.0)
        assert "stage rollout + eval 3/8 |" in shown(dash)
        dash.end_stage("rollout + eval")
        assert "stage step 1 done |" in shown(dash)
