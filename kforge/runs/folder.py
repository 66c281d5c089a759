"""A run folder on disk: `runs/<name>/` with config, status, metrics, checkpoints and logs.

Every whole-file write goes to a temp file in the same folder and is renamed over the target, so a crash
(even kill -9) leaves either the old or the new file; JSONL files are only ever appended to.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import psutil

STATUS_FILE = "status.json"
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_FILE = "checkpoints.jsonl"
LOG_FILE = "logs.log"
STOP_FILE = "STOP"  # `kforge runs stop` drops this; the loop checkpoints and exits at the next step


def atomic_write_text(path: Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a") as fh:
        fh.write(json.dumps(record, default=_json_default) + "\n")
        fh.flush()


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line; a torn last line (crash mid-append) is skipped."""
    out: list[dict[str, Any]] = []
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def pid_alive(pid: int | None, started: float | None = None) -> bool:
    """Is this pid still the process that wrote the status (not a recycled pid)?"""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and proc.create_time() > started + 5:
            return False
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


@dataclass
class RunFolder:
    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @classmethod
    def create(cls, runs_dir: str | Path, name: str, config_yaml: str) -> "RunFolder":
        path = Path(runs_dir) / name
        if path.exists() and any(path.iterdir()):
            raise FileExistsError(f"run folder {path} already exists; pick another --name or use --resume {path}")
        path.mkdir(parents=True, exist_ok=True)
        run = cls(path)
        atomic_write_text(path / CONFIG_FILE, config_yaml)
        run.set_status("starting")
        return run

    # -- status ---------------------------------------------------------------------------------------
    def read_status(self) -> dict[str, Any]:
        try:
            return json.loads((self.path / STATUS_FILE).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return {}

    def set_status(self, status: str, **extra: Any) -> None:
        current = self.read_status()
        now = time.time()
        record = {**current, **extra, "status": status, "updated": now}
        if status in ("starting", "running"):
            record.update(pid=os.getpid(), host=socket.gethostname(), pid_started=psutil.Process().create_time())
            record.setdefault("started", now)
        else:
            record["ended"] = now
        atomic_write_text(self.path / STATUS_FILE, json.dumps(record, indent=2, default=_json_default))

    def effective_status(self) -> str:
        """The written status, except that a 'running' run whose process is gone is 'crashed'."""
        st = self.read_status()
        status = st.get("status", "unknown")
        if status in ("starting", "running", "stopping"):
            same_host = st.get("host") in (None, socket.gethostname())
            if same_host and not pid_alive(st.get("pid"), st.get("pid_started")):
                return "crashed"
        return status

    # -- records --------------------------------------------------------------------------------------
    def log_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / METRICS_FILE, record)

    def metrics(self) -> list[dict[str, Any]]:
        """One record per step: a resumed run re-does the steps after its last checkpoint and appends them
        again, and the later record of a step wins."""
        by_step: dict[Any, dict[str, Any]] = {}
        for record in read_jsonl(self.path / METRICS_FILE):
            by_step[record.get("step")] = record
        return list(by_step.values())

    def log_checkpoint(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / CHECKPOINTS_FILE, record)

    def checkpoints(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / CHECKPOINTS_FILE)

    def last_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint whose folder is complete on disk."""
        for record in reversed(self.checkpoints()):
            if (self.path / record["path"]).is_dir():
                return record
        return None

    @property
    def log_path(self) -> Path:
        return self.path / LOG_FILE

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    def stop_requested(self) -> bool:
        return (self.path / STOP_FILE).exists()

    def summary(self) -> dict[str, Any]:
        metrics = self.metrics()
        st = self.read_status()
        rewards = [m["reward/mean"] for m in metrics if isinstance(m.get("reward/mean"), (int, float))]
        fast1 = [m[k] for m in metrics for k in ("eval/fast_1", "fast_1") if isinstance(m.get(k), (int, float))]
        ckpt = self.last_checkpoint()
        return {
            "name": self.name,
            "status": self.effective_status(),
            "started": st.get("started"),
            "steps": max((m.get("step", 0) for m in metrics), default=0),
            "best_reward": max(rewards) if rewards else None,
            "fast_1": fast1[-1] if fast1 else None,
            "last_checkpoint": ckpt["path"] if ckpt else None,
            "preset": st.get("preset"),
            "path": str(self.path),
        }


def list_runs(runs_dir: str | Path) -> Iterator[RunFolder]:
    root = Path(runs_dir)
    if not root.is_dir():
        return
    for child in sorted(root.iterdir()):
        if child.is_dir() and (child / STATUS_FILE).exists():
            yield RunFolder(child)


def find_run(spec: str, runs_dir: str | Path) -> RunFolder:
    """A run by folder path or by name under runs_dir."""
    path = Path(spec)
    for candidate in (path, Path(runs_dir) / spec):
        if (candidate / STATUS_FILE).exists() or (candidate / CONFIG_FILE).exists():
            return RunFolder(candidate)
    names = [r.name for r in list_runs(runs_dir)]
    import difflib

    close = difflib.get_close_matches(spec, names, n=1)
    hint = f"; did you mean {close[0]}?" if close else ("; `kforge runs ls` lists them" if names else "")
    raise FileNotFoundError(f"no run {spec!r} under {runs_dir}{hint}")
