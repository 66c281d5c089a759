"""The checks `kforge train` runs before it makes a run folder, and `kforge doctor` runs among its own.

One list for both, so doctor's "ready" means that `train` starts: every way a run could fail only after the
problems, the eval pool and the model were loaded (a folder that cannot be written, no disk, a model that is
neither cached nor reachable, a missing or leaking RAG index, W&B without credentials, a config that needs a
GPU on a machine without one) is a row here, asked in seconds.
"""

from __future__ import annotations

import netrc
import os
from pathlib import Path
from urllib.parse import urlparse

from kforge.config.paths import cache_root
from kforge.config.schema import KforgeConfig
from kforge.gpus import Gpu, query_gpus, visible_records
from kforge.ops.doctor_base import CheckResult, gpu_only, gpu_reasons
from kforge.ops.doctor_data import check_disk, check_model, check_rag
from kforge.space import UnwritableFolder, check_writable


def preflight(cfg: KforgeConfig, runs_dir: str | Path | None = None,
              gpus: tuple[list[Gpu] | None, str] | None = None) -> list[CheckResult]:
    """The rows, cheapest first (the model's may ask the hub). `gpus` is `query_gpus()`'s answer when the
    caller has it."""
    runs_dir = Path(runs_dir if runs_dir is not None else cfg.log.runs_dir)
    if gpus is None:
        found, source = query_gpus()
        gpus = (visible_records(found) if found is not None else None, source)
    rows = check_folders(runs_dir) + check_disk(runs_dir) + check_gpus(cfg, *gpus) + check_wandb(cfg)
    rows += check_rag(cfg)  # its leak guard first: an index that leaks is refused whatever else
    return rows + check_model(cfg)


# ------------------------------------------------------------------------------------------- folders


def check_folders(runs_dir: Path) -> list[CheckResult]:
    """The run folders' parent and kforge's cache (reference outputs, converted models) can be made and written:
    asked as the run folder's own writes ask it (a block written, the OS's reason kept)."""
    rows = []
    for what, folder, fix in (("log.runs_dir", runs_dir, "pass --runs-dir / log.runs_dir=DIR naming a writable folder"),
                              ("kforge cache", cache_root(), "set KFORGE_CACHE_DIR to a writable folder")):
        folder = Path(folder).expanduser()
        try:
            check_writable(folder, what)
        except UnwritableFolder as exc:
            rows.append(CheckResult(f"folder {what}", "fail", f"{folder}: {exc.why}", fix))
        else:
            rows.append(CheckResult(f"folder {what}", "pass", f"{folder} can be written"))
    return rows


# ----------------------------------------------------------------------------------------------- GPUs


def check_gpus(cfg: KforgeConfig, gpus: list[Gpu] | None, source: str) -> list[CheckResult]:
    needs = gpu_reasons(cfg)
    need_text = ", ".join(needs)
    if not gpus:
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES") is not None and gpus is not None
        detail = "no GPU visible" + (f" ({source})" if gpus is None else "") + (
            " (CUDA_VISIBLE_DEVICES hides them)" if hidden else "")
        hard = gpu_only(cfg)
        if hard or (needs and not cfg.placement.allow_cpu):
            fix = "run on an NVIDIA GPU machine with the driver installed, or use --preset tiny on CPU"
            if not hard:
                fix += "; to start it on the CPU anyway (nothing timed, a big model for days): --allow-cpu"
            return [CheckResult("gpus", "fail", f"{detail}; this config needs one for {', '.join(hard) or need_text}",
                                fix)]
        if needs:
            return [CheckResult("gpus", "warn", f"{detail}; placement.allow_cpu=true: CPU mode although "
                                f"{need_text} wants a GPU, so nothing is timed", "run on an NVIDIA GPU machine")]
        return [CheckResult("gpus", "warn", f"{detail}: CPU mode (hf rollouts, Triton interpreter, no timing)",
                            "fine for --preset tiny; GPU presets need NVIDIA GPUs")]
    rows = [CheckResult("gpus", "pass", f"{len(gpus)} visible (driver {gpus[0].driver}, via {source})")]
    for g in gpus:
        detail = f"{g.name}, {g.total_mib / 1024:.1f} GiB, {g.used_mib / 1024:.1f} GiB in use"
        busy = g.total_mib > 0 and g.used_mib / g.total_mib > 0.10
        rows.append(CheckResult(
            f"gpu {g.index}", "warn" if busy else "pass", detail,
            "another process holds memory on this GPU (nvidia-smi shows which); the run gets less" if busy else "",
        ))
    return rows


# ----------------------------------------------------------------------------------------------- W&B


def check_wandb(cfg: KforgeConfig) -> list[CheckResult]:
    """W&B asks for a key on a terminal and raises without one: where its own lookup would find one."""
    import importlib.util

    project = cfg.log.wandb_project
    if not project:
        return [CheckResult("wandb", "pass", "not used (log.wandb_project is not set)")]
    if importlib.util.find_spec("wandb") is None:  # refused like missing credentials: a whole run without W&B
        return [CheckResult("wandb", "fail", f"log.wandb_project={project} but wandb is not installed",
                            "pip install 'kforge[wandb]', or unset log.wandb_project")]
    mode = os.environ.get("WANDB_MODE", "").lower()
    if mode in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_DISABLED", "").lower() in ("1", "true"):
        return [CheckResult("wandb", "pass", f"project {project}, WANDB_MODE={mode or 'disabled'}: no login needed")]
    # The W&B server whose ~/.netrc entry holds the key: W&B's own default unless WANDB_BASE_URL names another.
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    where = _wandb_credentials(host)
    if where:
        return [CheckResult("wandb", "pass", f"project {project}, credentials from {where}")]
    return [CheckResult("wandb", "fail", f"log.wandb_project={project} but no W&B credentials (no WANDB_API_KEY, "
                        f"no {host} entry in ~/.netrc, no api_key in W&B's settings)",
                        "run `wandb login` (or set WANDB_API_KEY); WANDB_MODE=offline logs locally; "
                        "or unset log.wandb_project")]


def _wandb_credentials(host: str) -> str | None:
    if os.environ.get("WANDB_API_KEY"):
        return "WANDB_API_KEY"
    token = os.environ.get("WANDB_IDENTITY_TOKEN_FILE")
    if token and Path(token).is_file():
        return "WANDB_IDENTITY_TOKEN_FILE"
    config_dir = Path(os.environ.get("WANDB_CONFIG_DIR") or Path.home() / ".config" / "wandb")
    for settings in (config_dir / "settings", Path("wandb") / "settings"):
        try:
            if any(line.split("=")[0].strip() == "api_key" for line in settings.read_text().splitlines()):
                return str(settings)
        except (OSError, UnicodeDecodeError):
            continue
    for path in filter(None, (os.environ.get("NETRC"), Path.home() / ".netrc", Path.home() / "_netrc")):
        try:
            if netrc.netrc(str(path)).authenticators(host):
                return str(path)
        except (OSError, netrc.NetrcParseError):
            continue
    return None
