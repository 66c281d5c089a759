"""The training view: a Rich Live dashboard on a terminal, a throttled plain status line otherwise."""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from typing import Any, Iterator

from rich.console import Console, ConsoleDimensions, Group
from rich.control import Control
from rich.live import Live
from rich.panel import Panel
from rich.segment import ControlType
from rich.table import Table
from rich.text import Text

SPARK = "▁▂▃▄▅▆▇█"
# What TRL users watch of the optimiser step, as the learner logs it.
LEARNER_KEYS = (("learner/loss", "loss"), ("learner/kl", "kl"), ("learner/lr", "lr"), ("learner/grad_norm", "grad norm"))


def sparkline(values: list[float], width: int = 30) -> str:
    vals = values[-width:]
    if not vals:
        return ""
    lo, hi = min(vals), max(vals)
    span = hi - lo or 1.0
    return "".join(SPARK[min(len(SPARK) - 1, int((v - lo) / span * (len(SPARK) - 1)))] for v in vals)


class _Live(Live):
    """Rich's Live, which redraws a frame by moving the cursor up as many rows as the last frame had. After the
    terminal shrank those rows are no longer where they were (a narrower terminal re-wraps the old frame's
    lines, a lower one scrolls its top away): the old frame would stay on screen above the new one. So after
    a shrink the screen is cleared before the next frame."""

    _size: tuple[int, int] | None = None

    def refresh(self) -> None:
        with self._lock:
            if self.console.is_terminal and not self.console.is_dumb_terminal:
                size = tuple(self.console.size)
                shrank = self._size is not None and (size[0] < self._size[0] or size[1] < self._size[1])
                self._size = size  # type: ignore[assignment]
                if shrank and self._started:
                    self._live_render.set_renderable(self.renderable)
                    # Printed while live: Rich puts the cursor at the frame's start, this clears the screen
                    # and homes the cursor, and the frame is drawn from the top.
                    self.console.print(Control((ControlType.CLEAR,), (ControlType.HOME,)))
            super().refresh()


class Dashboard:
    def __init__(self, console: Console, run_name: str, total_steps: int, plan_text: str, live: bool | None = None,
                 plain_every_s: float = 10.0, start_step: int = 0):
        self.console = console
        self.live_mode = console.is_terminal if live is None else live
        self.run_name = run_name
        self.total_steps = total_steps
        self.plan_text = plan_text
        self.plain_every_s = plain_every_s
        self.step = start_step  # a resumed run starts where its checkpoint was
        # The stages under way, in the order they began: name -> [done, total, the step they belong to]. More
        # than one at a time when the next step's rollouts overlap this step's learning.
        self.stages: dict[str, list[int]] = {}
        self.idle = "starting"  # shown while no stage is under way
        self.started = time.time()
        self.step_times: deque[float] = deque(maxlen=20)
        self.history: dict[str, list[float]] = {"reward/mean": [], "rate/correct": []}
        self.last_metrics: dict[str, Any] = {}
        self.kernels: deque[tuple[str, int, str, str]] = deque(maxlen=6)
        self.warnings: deque[str] = deque(maxlen=4)
        self._last_plain = 0.0
        self._live: Live | None = None
        self._logs = contextlib.ExitStack()
        self._lock = threading.RLock()  # the learner's thread and the event loop both report
        self._whole = False
        self._version = 0  # counts the updates: a frame's layout is fitted again only after one
        self._fitted: tuple[tuple[int, int, int], tuple[int, int, bool, bool, bool]] | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> "Dashboard":
        if self.live_mode:
            from kforge.ui.console import logs_above

            # Rendered on every refresh (twice a second), not only on an update: the clock moves during a
            # long stage and the frame follows the terminal's size.
            self._live = _Live(console=self.console, refresh_per_second=2, transient=False,
                               get_renderable=self._render)
            self._live.__enter__()
            # The view owns the terminal from here: print() and warnings reach it through Live's own
            # redirection, log handlers (which hold their own console or stream) through this.
            self._logs.enter_context(logs_above(self.console))
        # Off a terminal the caller has already printed the placement line: not twice.
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._whole = True  # the last frame stays in the scroll-back, nothing redraws it: all of it
            self._live.__exit__(*exc)  # draws the last frame, from the last update
            self._live = None
        self._logs.close()

    # -- updates --------------------------------------------------------------------------------------
    def set_stage(self, stage: str, total: int = 0, step: int | None = None) -> None:
        """A stage begins (of the step under way unless `step` says which); it shows until end_stage or the
        end of its step."""
        with self._lock:
            self.stages.pop(stage, None)
            self.stages[stage] = [0, total, self.step + 1 if step is None else step]
        self._refresh()

    def end_stage(self, stage: str) -> None:
        with self._lock:
            self.stages.pop(stage, None)
        self._refresh()

    @contextlib.contextmanager
    def stage(self, stage: str, total: int = 0, step: int | None = None) -> Iterator[None]:
        self.set_stage(stage, total, step)
        try:
            yield
        finally:
            self.end_stage(stage)

    def advance(self, n: int = 1, stage: str | None = None) -> None:
        """Progress in `stage` (the latest to begin when not named)."""
        with self._lock:
            name = stage if stage is not None else next(reversed(self.stages), None)
            if name in self.stages:
                self.stages[name][0] += n
        self._refresh()

    def kernel(self, problem_key: str, turn: int, status: str, detail: str = "") -> None:
        with self._lock:
            self.kernels.appendleft((problem_key, turn, status, detail))
        self._refresh()

    def warn(self, message: str) -> None:
        # Off a terminal the warning is only logged (by the caller), so it prints once.
        with self._lock:
            self.warnings.appendleft(message)
        self._refresh()

    def end_step(self, step: int, metrics: dict[str, Any], step_seconds: float) -> None:
        with self._lock:
            self.step = step
            # The step's stages are over: its last one (learn 0/1, the optimiser step, which reports no
            # progress of its own) must not stay on screen as if it were still running. A later step's
            # stage already under way (its rollouts, overlapping this step's learning) stays.
            self.stages = {name: s for name, s in self.stages.items() if s[2] > step}
            self.idle = f"step {step} done"
            self.step_times.append(step_seconds)
            self.last_metrics = metrics
            for key in self.history:
                if isinstance(metrics.get(key), (int, float)):
                    self.history[key].append(float(metrics[key]))
        if not self.live_mode:
            self._plain_line(force=True)
        self._refresh()

    # -- rendering ------------------------------------------------------------------------------------
    def _eta(self) -> str:
        if not self.step_times or not self.total_steps:
            return "?"
        left = max(0, self.total_steps - self.step) * (sum(self.step_times) / len(self.step_times))
        return time.strftime("%H:%M:%S", time.gmtime(left))

    def _plain_line(self, force: bool = False) -> None:
        now = time.time()
        if not force and now - self._last_plain < self.plain_every_s:
            return
        self._last_plain = now
        with self._lock:
            m = self.last_metrics
            stages = ", ".join(f"{name} {done}/{total}" if total else name
                                for name, (done, total, _) in self.stages.items()) or self.idle
        parts = [f"step {self.step}/{self.total_steps}", f"stage {stages}"]
        for key, label in (("reward/mean", "reward"), ("rate/correct", "correct"), ("fast_1", "fast_1"),
                           *LEARNER_KEYS):
            if isinstance(m.get(key), (int, float)):
                parts.append(f"{label} {m[key]:.3g}" if key.startswith("learner/") else f"{label} {m[key]:.3f}")
            elif key == "fast_1" and self._untimed():
                parts.append("fast_1 not measured")
        parts.append(f"eta {self._eta()}")
        self.console.print(" | ".join(parts), markup=False, highlight=False, soft_wrap=True)

    def _untimed(self) -> bool:
        """A step's metrics hold no fast_1 when its correct kernels were not timed (a CPU run)."""
        return "rate/correct" in self.last_metrics and "fast_1" not in self.last_metrics

    def _refresh(self) -> None:
        with self._lock:
            self._version += 1
        if self._live is None:
            self._plain_line()
        # Live draws on its own clock (get_renderable): an update only changes what the next frame shows.

    # From the whole view to the least of it: (kernel rows, warning rows, plan line, GPU panel, throughput rows).
    _LAYOUTS = ((6, 4, True, True, True), (3, 4, True, True, True), (3, 2, False, True, True),
                (1, 1, False, True, True), (1, 1, False, False, True), (0, 1, False, False, True),
                (0, 1, False, False, False))

    def _render(self) -> Group:
        """The view, made to fit the terminal's height: Live redraws a frame by moving the cursor up over the
        last one, and rows that scrolled off the top cannot be reached, so a taller frame is cut at the bottom
        (the latest kernels, the warnings). Less is shown instead, the newest first."""
        with self._lock:
            if self._live is None or self._whole:
                return self._group(self._LAYOUTS[0])
            return self._group(self._fit(self.console.size))

    def _fit(self, size: ConsoleDimensions) -> tuple[int, int, bool, bool, bool]:
        """The fullest layout whose frame is at most the terminal's height. Measured part by part, and again
        only when something shown or the terminal's size changed (Live renders twice a second)."""
        key = (self._version, size.width, size.height)
        if self._fitted is not None and self._fitted[0] == key:
            return self._fitted[1]
        options = self.console.options.update(width=size.width, height=None)
        heights: dict[tuple[str, int | None], int] = {}

        def rows(name: str, arg: int | None = None) -> int:
            if (name, arg) not in heights:
                part = getattr(self, f"_{name}")(arg) if arg is not None else getattr(self, f"_{name}")()
                heights[name, arg] = 0 if part is None else len(self.console.render_lines(part, options, pad=False))
            return heights[name, arg]

        chosen = self._LAYOUTS[-1]
        for layout in self._LAYOUTS:
            kernel_rows, warning_rows, plan, gpu_panel, throughput = layout
            total = (rows("head") + (rows("plan") if plan else 0) + rows("stage_panel", throughput)
                     + rows("curves") + (rows("gpus") if gpu_panel else 0) + rows("kernels", kernel_rows)
                     + rows("warnings", warning_rows))
            if total <= size.height:
                chosen = layout
                break
        self._fitted = (key, chosen)
        return chosen

    def _group(self, layout: tuple[int, int, bool, bool, bool]) -> Group:
        kernel_rows, warning_rows, plan, gpu_panel, throughput = layout
        parts = [self._head(), self._plan() if plan else None, self._stage_panel(throughput), self._curves(),
                 self._gpus() if gpu_panel else None, self._kernels(kernel_rows), self._warnings(warning_rows)]
        return Group(*(part for part in parts if part is not None))

    def _head(self) -> Table:
        head = Table.grid(padding=(0, 2))
        head.add_row(
            Text(f"kforge · {self.run_name}", style="bold"),
            f"step {self.step}/{self.total_steps}",
            f"ETA {self._eta()}",
            f"elapsed {time.strftime('%H:%M:%S', time.gmtime(time.time() - self.started))}",
        )
        return head

    def _plan(self) -> Text:
        return Text(self.plan_text, style="dim")

    def _stage_panel(self, throughput: bool) -> Panel:
        m = self.last_metrics
        stage = Table.grid(padding=(0, 2))
        for name, (done, total, _) in self.stages.items():
            frac = min(1.0, done / total) if total else 0.0
            bar = "█" * int(frac * 30) + "·" * (30 - int(frac * 30)) if total else ""
            stage.add_row(Text(name, style="cyan"), bar, f"{done}/{total}" if total else "")
        if not self.stages:
            stage.add_row(Text(self.idle, style="cyan"), "", "")
        for key, label in (("throughput/generate_tok_s", "generate tok/s"),
                           ("throughput/eval_kernels_min", "kernels/min"), ("learner/tokens_per_s", "learner tok/s")):
            if throughput and isinstance(m.get(key), (int, float)):
                stage.add_row(label, f"{m[key]:.1f}", "")
        return Panel(stage, title="stage")

    def _curves(self) -> Panel:
        m = self.last_metrics
        curves = Table(show_header=True, header_style="bold", box=None)
        curves.add_column("metric")
        curves.add_column("now")
        curves.add_column("trend")
        for key, values in self.history.items():
            curves.add_row(key, f"{values[-1]:.3f}" if values else "-", sparkline(values))
        for key in ("fast_1", "speedup/mean", *(key for key, _ in LEARNER_KEYS)):
            if isinstance(m.get(key), (int, float)):
                curves.add_row(key, f"{m[key]:.4g}", "")
            elif key == "fast_1" and self._untimed():
                curves.add_row(key, "not measured", "")
        return Panel(curves, title="reward and correctness")

    def _gpus(self) -> Panel | None:
        m = self.last_metrics
        gpus = Table(show_header=True, header_style="bold", box=None)
        gpus.add_column("role")
        gpus.add_column("mem GiB")
        gpus.add_column("util %")
        for role in ("rollout", "learner", "eval"):
            mem, util = m.get(f"gpu/{role}/mem_used_gb"), m.get(f"gpu/{role}/util_pct")
            if mem is not None:
                gpus.add_row(role, f"{mem:.1f}", f"{util:.0f}" if util is not None else "-")
        return Panel(gpus, title="GPUs") if gpus.row_count else None

    def _kernels(self, rows: int) -> Panel | None:
        if not rows:
            return None
        kernels = Table(show_header=True, header_style="bold", box=None)
        kernels.add_column("problem")
        kernels.add_column("turn")
        kernels.add_column("verdict")
        kernels.add_column("")
        for key, turn, status, detail in list(self.kernels)[:rows]:
            style = "green" if status == "correct" else ("yellow" if status == "incorrect" else "red")
            # Text, not markup: a problem's name and the evaluator's detail are printed as they are.
            kernels.add_row(Text(key), str(turn), Text(status, style=style), Text(detail))
        return Panel(kernels, title="latest kernels")

    def _warnings(self, rows: int) -> Panel | None:
        if not (self.warnings and rows):
            return None
        return Panel(Text("\n".join(list(self.warnings)[:rows]), style="yellow"), title="warnings")
