"""A run folder on disk: `runs/<name>/` with config, status, metrics, checkpoints and logs.

Every whole-file write goes to a temp file in the same folder and is renamed over the target, so a crash
(even kill -9) leaves either the old or the new file; JSONL files are only ever appended to.
"""

from __future__ import annotations

import difflib
import json
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil

from kforge.errors import UserError
from kforge.runs.checkpoints import (  # noqa: F401
    CHECKPOINTS_DIR,
    CKPT_PREFIX,
    LEARNER_DIR,
    TRAINER_STATE,
    checkpoint_damage,
    checkpoint_step,
    read_trainer_state,
)
from kforge.runs.layout import (  # noqa: F401
    ADAPTERS_DIR,
    CHECKPOINTS_FILE,
    CONFIG_FILE,
    CONFIG_HISTORY_FILE,
    ENDED,
    LIVE,
    LOG_FILE,
    METRICS_FILE,
    RUN_ENTRIES,
    SAMPLES_DIR,
    STATUS_FILE,
    STOP_FILE,
    written_by_run,
)
from kforge.space import atomic_write_text, check_writable, refused_write


class RunNotFound(UserError, FileNotFoundError):
    """No run, or no usable checkpoint of it, where the user pointed; the message says what is there instead."""


class RunFolderTaken(UserError, FileExistsError):
    """A new run's folder is taken by something that is not a failed start of kforge's."""


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a+b") as fh:
        # A line torn by a crash mid-append must not swallow this record: start it on a line of its own.
        torn = False
        if fh.seek(0, os.SEEK_END) > 0:
            fh.seek(-1, os.SEEK_END)
            torn = fh.read(1) != b"\n"
        fh.write((("\n" if torn else "") + json.dumps(record, default=_json_default) + "\n").encode())
        fh.flush()


def drop_torn_line(path: Path) -> str | None:
    """Cut a torn last line (a crash mid-append) off a JSONL file, keeping it in `NAME.torn`; returns
    the kept copy's path, or None when the file ends cleanly."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    cut = data.rfind(b"\n") + 1
    tail = data[cut:]
    if not tail.strip():
        return None
    try:
        json.loads(tail)
        return None  # a whole record that only lacks its newline
    except ValueError:
        pass
    kept = Path(f"{path}.torn")
    with open(kept, "ab") as fh:
        fh.write(tail + b"\n")
    with open(path, "r+b") as fh:
        fh.truncate(cut)
    return str(kept)


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


def _json_default(obj: object) -> object:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


# psutil derives a start time from the boot time and the process's start ticks: the same process reads
# the same value again, within clock-tick rounding.
START_TIME_SLACK_S = 1.0


def pid_alive(pid: int | None, started: float | None = None) -> bool:
    """Is this pid still the process that wrote the status? With `started` (the recorded start time), only
    a process that started then: a recycled pid, or a folder copied from another machine of the same host
    name, holds a pid that started at another time, earlier or later."""
    if not pid:
        return False
    try:
        proc = psutil.Process(pid)
        if started is not None and abs(proc.create_time() - float(started)) > START_TIME_SLACK_S:
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
        check_run_name(name)
        path = Path(runs_dir) / name
        if path.exists() and not path.is_dir():
            raise RunFolderTaken(f"{path} is a file, not a run folder; pick another --name or --runs-dir")
        check_writable(path, "run folder")  # before anything is made or removed
        if path.exists() and any(path.iterdir()):
            run = cls(path)
            if not run.never_stepped():
                raise RunFolderTaken(run.taken())
            # A start that ended before its first step (a typo, a missing dataset, Ctrl-C while the model loaded)
            # holds nothing to keep, and never_stepped() saw that every entry is kforge's: remove those, not the folder.
            for entry in path.iterdir():
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
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

    def set_status(self, status: str, **extra: object) -> None:
        current = self.read_status()
        now = time.time()
        record = {**current, **extra, "status": status, "updated": now}
        if status != "failed" and "error" not in extra:
            record.pop("error", None)  # an earlier attempt's error does not describe this state
        if status != "stopped":
            record.pop("stopped_by", None)
        if status in ("starting", "running"):
            record.update(pid=os.getpid(), host=socket.gethostname(), pid_started=psutil.Process().create_time())
            record.setdefault("started", now)
        else:
            record["ended"] = now
        self.write_status(record)

    def write_status(self, record: dict[str, Any]) -> None:
        """The one writer of status.json; also puts back a record read earlier (a failed attempt undone)."""
        atomic_write_text(self.path / STATUS_FILE, json.dumps(record, indent=2, default=_json_default))

    def never_stepped(self, mine_only: bool = True) -> bool:
        """A start of kforge's that ended before any step (`runs stop --now` while the model loaded too): its status
        file says so (a folder without one, or with one kforge did not write, is someone else's), no metrics, no
        checkpoint past step 0, and (`mine_only`) nothing in the folder but what a run writes."""
        if not self.read_status().get("started") or self.effective_status() not in ENDED:
            return False
        if mine_only and not all(written_by_run(entry.name) for entry in self.path.iterdir()):
            return False
        return not read_jsonl(self.path / METRICS_FILE) and not any(step > 0 for step in self.checkpoint_dirs())

    def taken(self) -> str:
        """Why a new run cannot have this folder, and what to do instead: one line."""
        if not self.read_status().get("started"):
            return f"{self.path} already exists and is not a kforge run; pick another --name or --runs-dir"
        if self.never_stepped(mine_only=False):
            theirs = ", ".join(sorted(e.name for e in self.path.iterdir() if not written_by_run(e.name)))
            return (f"{self.path} already exists: a run that never stepped, holding files kforge did not write "
                    f"({theirs}); move them out to reuse the name, or pick another --name")
        status, steps = self.effective_status(), self.summary()["steps"]
        if status in LIVE:  # its process lives: neither resumed nor removed under it
            return (f"run {self.name} is {status} at {self.path}: stop it first with `kforge runs stop {self.path}`, "
                    "or pick another --name")
        return (f"run {self.name} already exists at {self.path} ({status}, {steps} step(s)): continue it with "
                f"`kforge train --resume {self.path}`, remove it with `kforge runs rm {self.path}`, or pick "
                "another --name")

    def effective_status(self) -> str:
        """The written status, except that a 'running' run whose process is gone is 'crashed'."""
        st = self.read_status()
        status = st.get("status", "unknown")
        if status in LIVE:
            same_host = st.get("host") in (None, socket.gethostname())
            if same_host and not pid_alive(st.get("pid"), st.get("pid_started")):
                return "crashed"
        return status

    # -- records --------------------------------------------------------------------------------------
    def record_config(self, config_yaml: str, record: dict[str, Any]) -> None:
        """A change of settings: first its record in config_history.jsonl, then config.yaml as it now is."""
        append_jsonl(self.path / CONFIG_HISTORY_FILE, {"time": time.time(), **record})
        atomic_write_text(self.config_path, config_yaml)

    def config_history(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / CONFIG_HISTORY_FILE)

    def log_metrics(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / METRICS_FILE, record)

    def metrics(self) -> list[dict[str, Any]]:
        """One record per step: a resumed run re-does the steps after its last checkpoint and appends them
        again, and the later record of a step wins."""
        return list({record.get("step"): record for record in read_jsonl(self.path / METRICS_FILE)}.values())

    def log_checkpoint(self, record: dict[str, Any]) -> None:
        append_jsonl(self.path / CHECKPOINTS_FILE, record)

    def checkpoints(self) -> list[dict[str, Any]]:
        return read_jsonl(self.path / CHECKPOINTS_FILE)

    def last_checkpoint(self) -> dict[str, Any] | None:
        """The newest checkpoint whose folder is complete on disk and whose trainer state is not damaged."""
        for record in reversed(self.checkpoints()):
            if (self.path / record["path"]).is_dir() and checkpoint_damage(self.path / record["path"]) is None:
                return record
        return None

    def usable_checkpoints(self) -> list[Path]:
        """Recorded checkpoints complete on disk whose files pass the format checks, newest first."""
        out = []
        for record in reversed(self.checkpoints()):
            ckpt = self.path / record["path"]
            if ckpt.is_dir() and ckpt not in out and checkpoint_damage(ckpt) is None:
                out.append(ckpt)
        return out

    def damaged_checkpoints(self) -> list[str]:
        """One line per recorded checkpoint newer than `last_checkpoint()` that cannot be resumed from."""
        last = self.last_checkpoint()
        out = []
        for record in reversed(self.checkpoints()):
            if last is not None and record["step"] <= last["step"]:
                break
            ckpt = self.path / record["path"]
            why = checkpoint_damage(ckpt) if ckpt.is_dir() else f"{ckpt}: its folder is missing"
            if why:
                out.append(why)  # it names the file
        return out

    # -- checkpoints: the layout lives here; the trainer, export and eval ask for paths ---------------
    def write_checkpoint(self, step: int, write_learner: Callable[[Path], object], state: dict[str, Any], reason: str) -> Path:
        """`write_learner(folder)` plus the trainer state into a temp folder, renamed into place only when
        complete (a kill -9 never leaves half a checkpoint), then recorded in checkpoints.jsonl."""
        root = self.path / CHECKPOINTS_DIR
        root.mkdir(exist_ok=True)
        final = root / f"{CKPT_PREFIX}{step:06d}"
        tmp = root / f".tmp_{CKPT_PREFIX}{step:06d}_{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            write_learner(tmp / LEARNER_DIR)
            atomic_write_text(tmp / TRAINER_STATE, json.dumps({**state, "step": step, "reason": reason,
                                                               "time": time.time()}, indent=2))
            if final.exists():
                shutil.rmtree(final)
            os.replace(tmp, final)
        except BaseException as exc:
            refused = refused_write(exc, root) if isinstance(exc, Exception) else None
            shutil.rmtree(tmp, ignore_errors=True)  # a full disk must not stay full of half a checkpoint
            if refused is not None:  # named by the checkpoints folder, not the temp one just removed
                raise OSError(refused.errno, refused.strerror, str(root)) from exc
            raise
        rel = final.relative_to(self.path)
        self.log_checkpoint({"step": step, "path": str(rel), "adapter": str(rel / LEARNER_DIR), "reason": reason,
                             "time": time.time()})
        return final

    def checkpoint_dirs(self) -> dict[int, Path]:
        """Complete checkpoint folders by step (temp folders of an interrupted write are not listed)."""
        out: dict[int, Path] = {}
        root = self.path / CHECKPOINTS_DIR
        if root.is_dir():
            for child in sorted(root.iterdir()):
                step = checkpoint_step(child) if child.is_dir() and child.name.startswith(CKPT_PREFIX) else None
                if step is not None:
                    out[step] = child
        return out

    def checkpoint(self, step: int | None = None) -> Path:
        """The checkpoint folder at `step`, or the newest complete one; RunNotFound says why not."""
        dirs = self.checkpoint_dirs()
        if step is not None:
            why = checkpoint_damage(dirs[step]) if step in dirs else f"run {self.name} has no checkpoint at step {step}"
            if why:
                raise RunNotFound(f"{why}; {self.usable_steps_line()}")
            return dirs[step]
        last = self.last_checkpoint()
        if last is not None:
            return self.path / last["path"]
        usable = [s for s, d in dirs.items() if checkpoint_damage(d) is None]
        if usable:
            return dirs[max(usable)]
        if dirs:
            why = checkpoint_damage(dirs[max(dirs)])
            raise RunNotFound(f"no checkpoint of run {self.name} can be used: {why}")
        raise RunNotFound(f"run {self.name} has no checkpoint yet; wait for one (log.save_every) or stop it "
                          f"with `kforge runs stop {self.name}`, which saves one")

    def usable_steps_line(self) -> str:
        usable = [str(s) for s, d in sorted(self.checkpoint_dirs().items()) if checkpoint_damage(d) is None]
        return f"checkpoints that can be used: --step {', '.join(usable)}" if usable else "no checkpoint can be used"

    def samples_path(self, step: int) -> Path:
        return self.path / SAMPLES_DIR / f"step_{step}.jsonl"

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


def check_run_name(name: str) -> None:
    """A run name is one folder name under the runs folder: `runs ls`, `--resume NAME` and `rm` find it there."""
    if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith(".") or "\0" in name:
        raise UserError(f"run name {name!r} must be one folder name (no '/', not starting with '.'), "
                         "e.g. --name kevin-lr1e-5")


def list_runs(runs_dir: str | Path) -> Iterator[RunFolder]:
    root = Path(runs_dir)
    for child in sorted(root.iterdir()) if root.is_dir() else []:
        if child.is_dir() and (child / STATUS_FILE).exists():
            yield RunFolder(child)


def find_run(spec: str, runs_dir: str | Path) -> RunFolder:
    """A run by folder path or by name under runs_dir."""
    path = Path(spec)
    for candidate in (path, Path(runs_dir) / spec):
        if (candidate / STATUS_FILE).exists() or (candidate / CONFIG_FILE).exists():
            return RunFolder(candidate)
    names = [r.name for r in list_runs(runs_dir)]
    close = difflib.get_close_matches(spec, names, n=1)
    hint = f"; did you mean {close[0]}?" if close else ("; `kforge runs ls` lists them" if names else "")
    raise RunNotFound(f"no run {spec!r} under {runs_dir}{hint}")
