"""`kforge runs watch`: a run's progress read from its folder (status.json, metrics.jsonl, logs.log).

It needs nothing from the training process, so it works from another terminal, over SSH, or after the
run has ended. `render` builds one Rich frame, `fields` the same as key/value rows for a pipe; `plain_line` is
the one-line form that follows a run in pipes and logs.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kforge.ops.run_control import last_lines
from kforge.runs.folder import LIVE, RunFolder
from kforge.ui.dashboard import sparkline

# (metrics key, label) in display order; only the keys a run has logged are shown.
WATCHED = (
    ("reward/mean", "reward"),
    ("rate/correct", "correct"),
    ("rate/compiled", "compiled"),
    ("rate/format_ok", "format ok"),
    ("fast_1", "fast_1"),
    ("eval/fast_1", "held-out fast_1"),
    ("speedup/mean", "speedup (correct)"),
    ("turns/mean", "turns"),
    ("learner/loss", "loss"),
    ("learner/kl", "kl"),
    ("learner/entropy", "entropy"),
    ("learner/grad_norm", "grad norm"),
    ("learner/lr", "lr"),
    ("length/response_tokens/mean", "response tokens"),
    ("throughput/generate_tok_s", "generate tok/s"),
    ("throughput/eval_kernels_min", "kernels/min"),
    ("time/step_s", "step s"),
)
STATUS_STYLE = {"running": "green", "starting": "green", "finished": "blue", "failed": "red", "crashed": "red",
                "stopped": "yellow", "killed": "red"}


@dataclass
class Snapshot:
    name: str
    status: str
    step: int
    total_steps: int | None
    preset: str | None
    pid: int | None
    host: str | None
    started: float | None
    ended: float | None
    stop_requested: bool
    checkpoint: str | None
    history: list[dict[str, Any]] = field(default_factory=list)
    log_tail: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def last(self) -> dict[str, Any]:
        return self.history[-1] if self.history else {}

    @property
    def active(self) -> bool:
        return self.status in LIVE

    def elapsed_s(self) -> float | None:
        if not self.started:
            return None
        end = time.time() if self.active or not self.ended else self.ended
        return max(0.0, end - self.started)

    def eta_s(self) -> float | None:
        times = [m["time/step_s"] for m in self.history[-5:] if isinstance(m.get("time/step_s"), (int, float))]
        if not times or not self.total_steps or not self.active:
            return None
        return max(0, self.total_steps - self.step) * sum(times) / len(times)


def snapshot(run: RunFolder, log_lines: int = 6) -> Snapshot:
    st = run.read_status()
    history = run.metrics()
    steps = [m.get("step") for m in history if isinstance(m.get("step"), int)]
    ckpt = run.last_checkpoint()
    tail = [ln.rstrip("\n") for ln in last_lines(run.log_path, log_lines).splitlines() if ln.strip()]
    return Snapshot(
        name=run.name, status=run.effective_status(), step=max(steps + [int(st.get("step") or 0)]),
        total_steps=st.get("total_steps"), preset=st.get("preset"), pid=st.get("pid"), host=st.get("host"),
        started=st.get("started"), ended=st.get("ended"), stop_requested=run.stop_requested(),
        checkpoint=ckpt["path"] if ckpt else None, history=history, log_tail=tail, error=st.get("error"),
    )


def _hms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return str(dt.timedelta(seconds=int(seconds)))


def _num(value: object) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    return f"{value:.2e}" if value and abs(value) < 1e-3 else f"{value:.4g}"


def header_text(s: Snapshot) -> str:
    total = f"/{s.total_steps}" if s.total_steps else ""
    parts = [f"run {s.name}", s.status, f"step {s.step}{total}"]
    if s.preset:
        parts.append(f"preset {s.preset}")
    parts.append(f"elapsed {_hms(s.elapsed_s())}")
    if s.eta_s() is not None:
        parts.append(f"eta {_hms(s.eta_s())}")
    if s.stop_requested and s.active:
        parts.append("stop requested")
    return " | ".join(parts)


def render(s: Snapshot) -> RenderableType:
    style = STATUS_STYLE.get(s.status, "")
    head = Text()
    head.append(f"{s.name}  ", style="bold")
    head.append(s.status, style=style)
    total = f"/{s.total_steps}" if s.total_steps else ""
    head.append(f"  step {s.step}{total}  elapsed {_hms(s.elapsed_s())}")
    if s.eta_s() is not None:
        head.append(f"  eta {_hms(s.eta_s())}")
    if s.preset:
        head.append(f"  preset {s.preset}")
    if s.pid and s.active:
        head.append(f"  pid {s.pid}" + (f"@{s.host}" if s.host else ""))
    if s.stop_requested and s.active:
        head.append("  stop requested: checkpoint + exit after this step", style="yellow")

    table = Table(show_header=True, header_style="bold", expand=False, box=None, padding=(0, 2))
    table.add_column("metric")
    table.add_column("last", justify="right")
    table.add_column("best", justify="right")
    table.add_column("history")
    for key, label in WATCHED:
        values = [float(m[key]) for m in s.history if isinstance(m.get(key), (int, float))]
        if not values:
            continue
        best = max(values) if not key.startswith(("learner/", "time/", "length/")) else None
        table.add_row(label, _num(values[-1]), _num(best), sparkline(values, width=30))
    if not table.rows:
        table.add_row("(no step finished yet)", "", "", "")

    parts: list[RenderableType] = [head, table, Text(f"last checkpoint: {s.checkpoint or '-'}")]
    if s.error and not s.active:
        parts.append(Text(f"error: {s.error}", style="red"))
    if s.log_tail:
        parts.append(Panel(Text("\n".join(s.log_tail)), title="logs.log", title_align="left", border_style="dim"))
    return Panel(Group(*parts), title="kforge runs watch", title_align="left", border_style=style or "white")


def fields(s: Snapshot) -> list[tuple[str, str]]:
    """The frame of `render` as (key, value) rows: what `runs watch --once` prints off a terminal, one
    `key: value` line each (a panel there would be padded to the console's full width)."""
    total = f"/{s.total_steps}" if s.total_steps else ""
    rows = [("run", s.name), ("status", s.status + (" (stop requested)" if s.stop_requested and s.active else "")),
            ("step", f"{s.step}{total}"), ("preset", s.preset or "-"), ("elapsed", _hms(s.elapsed_s()))]
    if s.eta_s() is not None:
        rows.append(("eta", _hms(s.eta_s())))
    if s.pid and s.active:
        rows.append(("pid", f"{s.pid}" + (f"@{s.host}" if s.host else "")))
    for key, label in WATCHED:
        values = [float(m[key]) for m in s.history if isinstance(m.get(key), (int, float))]
        if values:
            best = "" if key.startswith(("learner/", "time/", "length/")) else f" (best {_num(max(values))})"
            rows.append((label, _num(values[-1]) + best))
    rows.append(("last checkpoint", s.checkpoint or "-"))
    if s.error and not s.active:
        rows.append(("error", s.error))
    rows += [("log", line) for line in s.log_tail]
    return rows


def plain_line(s: Snapshot) -> str:
    parts = [header_text(s)]
    m = s.last
    for key, label in (("reward/mean", "reward"), ("rate/correct", "correct"), ("fast_1", "fast_1"),
                       ("learner/loss", "loss"), ("time/step_s", "step_s")):
        if isinstance(m.get(key), (int, float)):
            parts.append(f"{label} {m[key]:.3f}")
    parts.append(f"ckpt {s.checkpoint or '-'}")
    return " | ".join(parts)
