"""The training view: a Rich Live dashboard on a terminal, a throttled plain status line otherwise."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.panel import Panel
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
        self.stage = "starting"
        self.stage_done = 0
        self.stage_total = 0
        self.started = time.time()
        self.step_times: deque[float] = deque(maxlen=20)
        self.history: dict[str, list[float]] = {"reward/mean": [], "rate/correct": []}
        self.last_metrics: dict[str, Any] = {}
        self.kernels: deque[tuple[str, int, str, str]] = deque(maxlen=6)
        self.warnings: deque[str] = deque(maxlen=4)
        self._last_plain = 0.0
        self._live: Live | None = None

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> "Dashboard":
        if self.live_mode:
            self._live = Live(self._render(), console=self.console, refresh_per_second=2, transient=False)
            self._live.__enter__()
        # Off a terminal the caller has already printed the placement line: not twice.
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(*exc)
            self._live = None

    # -- updates --------------------------------------------------------------------------------------
    def set_stage(self, stage: str, total: int = 0) -> None:
        self.stage, self.stage_done, self.stage_total = stage, 0, total
        self._refresh()

    def advance(self, n: int = 1) -> None:
        self.stage_done += n
        self._refresh()

    def kernel(self, problem_key: str, turn: int, status: str, detail: str = "") -> None:
        self.kernels.appendleft((problem_key, turn, status, detail))
        self._refresh()

    def warn(self, message: str) -> None:
        # Off a terminal the warning is only logged (by the caller), so it prints once.
        self.warnings.appendleft(message)
        self._refresh()

    def end_step(self, step: int, metrics: dict[str, Any], step_seconds: float) -> None:
        self.step = step
        # The step's stages are over: its last one (learn 0/1, the optimiser step, which reports no
        # progress of its own) must not stay on screen as if it were still running.
        self.stage, self.stage_done, self.stage_total = f"step {step} done", 0, 0
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
        m = self.last_metrics
        counts = f" {self.stage_done}/{self.stage_total}" if self.stage_total else ""
        parts = [f"step {self.step}/{self.total_steps}", f"stage {self.stage}{counts}"]
        for key, label in (("reward/mean", "reward"), ("rate/correct", "correct"), ("fast_1", "fast_1"),
                           *LEARNER_KEYS):
            if isinstance(m.get(key), (int, float)):
                parts.append(f"{label} {m[key]:.3g}" if key.startswith("learner/") else f"{label} {m[key]:.3f}")
            elif key == "fast_1" and self._untimed():
                parts.append("fast_1 not measured")
        parts.append(f"eta {self._eta()}")
        self.console.print(" | ".join(parts), highlight=False, soft_wrap=True)

    def _untimed(self) -> bool:
        """A step's metrics hold no fast_1 when its correct kernels were not timed (a CPU run)."""
        return "rate/correct" in self.last_metrics and "fast_1" not in self.last_metrics

    def _refresh(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
        else:
            self._plain_line()

    def _render(self) -> Group:
        m = self.last_metrics
        head = Table.grid(padding=(0, 2))
        head.add_row(
            Text(f"kforge · {self.run_name}", style="bold"),
            f"step {self.step}/{self.total_steps}",
            f"ETA {self._eta()}",
            f"elapsed {time.strftime('%H:%M:%S', time.gmtime(time.time() - self.started))}",
        )
        stage = Table.grid(padding=(0, 2))
        frac = self.stage_done / self.stage_total if self.stage_total else 0.0
        bar = "█" * int(frac * 30) + "·" * (30 - int(frac * 30)) if self.stage_total else ""
        stage.add_row(f"[cyan]{self.stage}[/]", bar, f"{self.stage_done}/{self.stage_total}" if self.stage_total else "")
        for key, label in (("throughput/generate_tok_s", "generate tok/s"), ("throughput/eval_kernels_min", "kernels/min"),
                           ("learner/tokens_per_s", "learner tok/s")):
            if isinstance(m.get(key), (int, float)):
                stage.add_row(label, f"{m[key]:.1f}", "")

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

        gpus = Table(show_header=True, header_style="bold", box=None)
        gpus.add_column("role")
        gpus.add_column("mem GiB")
        gpus.add_column("util %")
        for role in ("rollout", "learner", "eval"):
            mem, util = m.get(f"gpu/{role}/mem_used_gb"), m.get(f"gpu/{role}/util_pct")
            if mem is not None:
                gpus.add_row(role, f"{mem:.1f}", f"{util:.0f}" if util is not None else "-")

        kernels = Table(show_header=True, header_style="bold", box=None)
        kernels.add_column("problem")
        kernels.add_column("turn")
        kernels.add_column("verdict")
        kernels.add_column("")
        for key, turn, status, detail in self.kernels:
            style = "green" if status == "correct" else ("yellow" if status == "incorrect" else "red")
            kernels.add_row(key, str(turn), f"[{style}]{status}[/]", detail)

        parts: list[Any] = [head, Text(self.plan_text, style="dim"), Panel(stage, title="stage"),
                            Panel(curves, title="reward and correctness")]
        if gpus.row_count:
            parts.append(Panel(gpus, title="GPUs"))
        parts.append(Panel(kernels, title="latest kernels"))
        if self.warnings:
            parts.append(Panel(Text("\n".join(self.warnings), style="yellow"), title="warnings"))
        return Group(*parts)
