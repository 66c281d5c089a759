"""`kforge doctor`: does this machine have what a run of a given config needs?

Each check returns rows of (check, status, detail, fix) with status pass / warn / fail; a run can start when
no row fails. The checks never initialise CUDA in this process (later forks of the eval zygote must stay
possible): GPUs are read through nvidia-smi or NVML, and torch/Triton are exercised in a subprocess.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from kforge.config.schema import KforgeConfig
from kforge.gpus import Gpu, query_gpus, visible_records  # noqa: F401 (Gpu re-exported)
from kforge.kernel_backends import KERNEL_BACKENDS
from kforge.ops.doctor_base import GIB, CheckResult, Status, can_start, gpu_reasons  # noqa: F401 (re-exported)
from kforge.ops.doctor_data import (  # noqa: F401 (re-exported)
    check_disk,
    check_model,
    check_problems,
    check_rag,
    hub_cached,
    hub_head,
)
from kforge.ops.doctor_runtime import (  # noqa: F401 (re-exported)
    TritonProbe,
    _nvcc_path,
    check_cuda_toolchain,
    check_sandbox,
    check_triton_and_torch,
    nvcc_release,
)
from kforge.ops.preflight import check_gpus, check_wandb, preflight  # noqa: F401 (re-exported)
from kforge.policy.prompts import PROMPT_OPTIONS

# ------------------------------------------------------------------------------------------- packages


@dataclass(frozen=True)
class PackageSpec:
    label: str
    module: str
    dists: tuple[str, ...]
    minimum: str | None
    install: str


PACKAGES = (
    PackageSpec("torch", "torch", ("torch",), "2.4", "pip install 'torch>=2.4' (a CUDA build on GPU machines)"),
    PackageSpec("triton", "triton", ("triton",), "3.0", "pip install 'triton>=3.0'"),
    PackageSpec("transformers", "transformers", ("transformers",), "4.46", "pip install 'transformers>=4.46'"),
    PackageSpec("peft", "peft", ("peft",), "0.13", "pip install 'peft>=0.13'"),
    PackageSpec("vllm", "vllm", ("vllm",), "0.8", "pip install 'kforge[gpu]' (vllm pins its own torch version)"),
    PackageSpec("bitsandbytes", "bitsandbytes", ("bitsandbytes",), "0.43", "pip install 'kforge[gpu]'"),
    PackageSpec("faiss", "faiss", ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12", "faiss-gpu-cu11", "faiss"), "1.8",
                "pip install 'kforge[rag]'"),
    PackageSpec("sentence-transformers", "sentence_transformers", ("sentence-transformers",), "3.0",
                "pip install 'kforge[rag]'"),
    PackageSpec("tensorboard", "tensorboard", ("tensorboard",), None, "pip install tensorboard"),
    PackageSpec("datasets", "datasets", ("datasets",), "2.19", "pip install 'kforge[hf]'"),
    PackageSpec("wandb", "wandb", ("wandb",), "0.17", "pip install 'kforge[wandb]'"),
)


def package_version(spec: PackageSpec) -> str | None:
    """The installed version, read from package metadata (importing vllm or torch here would be slow)."""
    try:
        if importlib.util.find_spec(spec.module) is None:
            return None
    except (ImportError, ValueError):
        return None
    for dist in spec.dists:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return "unknown version"


def _older(version: str, minimum: str) -> bool:
    from packaging.version import InvalidVersion, Version

    try:
        return Version(version) < Version(minimum)
    except InvalidVersion:
        return False


def package_need(label: str, cfg: KforgeConfig, gpus_visible: bool) -> tuple[str, str]:
    """("required" | "wanted" | "unused", why) for one package under this config."""
    raicl = PROMPT_OPTIONS[cfg.dataset.prompt_option].retrieves
    kernels = KERNEL_BACKENDS[cfg.dataset.backend]
    table: dict[str, tuple[str, str]] = {
        "torch": ("required", "everything"),
        "transformers": ("required", "model loading"),
        "peft": ("required", "the LoRA learner"),
        "triton": ("required", f"dataset.backend={cfg.dataset.backend}") if kernels.toolchain == "triton_probe"
        else ("wanted", "Triton kernels"),
        "bitsandbytes": ("required", "model.load_in_4bit=true") if cfg.model.load_in_4bit
        else ("unused", "model.load_in_4bit=false"),
        "faiss": ("required", "prompt_option=raicl") if raicl else ("unused", f"prompt_option={cfg.dataset.prompt_option}"),
        "sentence-transformers": ("required", "prompt_option=raicl") if raicl
        else ("unused", f"prompt_option={cfg.dataset.prompt_option}"),
        "tensorboard": ("wanted", "log.tensorboard=true: without it metrics go to metrics.jsonl only")
        if cfg.log.tensorboard else ("unused", "log.tensorboard=false"),
        "datasets": ("required", "dataset.source=hf") if cfg.dataset.source == "hf"
        else ("unused", f"dataset.source={cfg.dataset.source}"),
        # Without it the run goes on and logs to metrics.jsonl and TensorBoard only.
        "wandb": ("wanted", f"log.wandb_project={cfg.log.wandb_project}: without it W&B is skipped")
        if cfg.log.wandb_project else ("unused", "log.wandb_project is not set"),
    }
    if cfg.rollout.backend == "vllm":
        table["vllm"] = ("required", "rollout.backend=vllm")
    elif cfg.rollout.backend == "auto" and gpus_visible:
        table["vllm"] = ("wanted", "rollout.backend=auto falls back to the slower hf backend without it")
    else:
        table["vllm"] = ("unused", f"rollout.backend={cfg.rollout.backend}" + ("" if gpus_visible else ", no GPU"))
    return table[label]


def check_python() -> list[CheckResult]:
    v = sys.version_info
    text = f"Python {v.major}.{v.minor}.{v.micro} at {sys.executable}"
    if (v.major, v.minor) < (3, 10):
        return [CheckResult("python", "fail", text, "kforge needs Python >= 3.10: create a newer virtual environment")]
    return [CheckResult("python", "pass", text)]


def check_packages(cfg: KforgeConfig, gpus_visible: bool) -> list[CheckResult]:
    rows = []
    for spec in PACKAGES:
        version = package_version(spec)
        need, why = package_need(spec.label, cfg, gpus_visible)
        name = f"package {spec.label}"
        if version is None:
            if need == "required":
                rows.append(CheckResult(name, "fail", f"not installed (needed for {why})", spec.install))
            elif need == "wanted":
                rows.append(CheckResult(name, "warn", f"not installed ({why})", spec.install))
            else:
                rows.append(CheckResult(name, "pass", f"not installed; not needed ({why})"))
        elif spec.minimum and _older(version, spec.minimum):
            status: Status = "fail" if need == "required" else "warn"
            rows.append(CheckResult(name, status, f"{version} is older than {spec.minimum}", spec.install))
        else:
            rows.append(CheckResult(name, "pass", version + ("" if need != "unused" else f" (not needed: {why})")))
    rows.extend(check_vllm_torch_pin(cfg, gpus_visible))
    return rows


def check_vllm_torch_pin(cfg: KforgeConfig, gpus_visible: bool) -> list[CheckResult]:
    """vLLM wheels pin one torch version; another torch makes vLLM fail at import (or worse, at run time)."""
    try:
        requires = metadata.requires("vllm") or []
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return []
    from packaging.requirements import InvalidRequirement, Requirement

    for line in requires:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.name != "torch" or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
            continue
        if req.specifier and not req.specifier.contains(torch_version, prereleases=True):
            need, _ = package_need("vllm", cfg, gpus_visible)
            return [CheckResult(
                "vllm torch pin", "fail" if need == "required" else "warn",
                f"vllm {metadata.version('vllm')} wants torch{req.specifier}, torch {torch_version} is installed",
                f"pip install 'torch{req.specifier}' (or a vllm release built for torch {torch_version})",
            )]
        return [CheckResult("vllm torch pin", "pass", f"torch {torch_version} satisfies vllm's torch{req.specifier}")]
    return []


# ----------------------------------------------------------------------------------------------- GPUs


def check_placement(cfg: KforgeConfig) -> list[CheckResult]:
    """The config's placement.* GPUs against the visible ones (the same rule `kforge train` applies)."""
    from kforge.errors import UserError
    from kforge.train.placement import plan_placement

    chosen = cfg.placement.chosen()
    try:
        plan = plan_placement(None, chosen, pipelined=cfg.rollout.pipelined)
    except UserError as exc:  # a PlacementError, or the GpuIndexError of a GPU that is not there
        return [CheckResult("placement", "fail", str(exc), "fix placement.* (or --gpus), or CUDA_VISIBLE_DEVICES")]
    return [CheckResult("placement", "pass", plan.describe().removeprefix("placement: "))]


# -------------------------------------------------------------------------------------------- driver


def _guarded(name: str, fn: Callable[[], list[CheckResult]]) -> list[CheckResult]:
    """A check that crashes is reported, not fatal: the other checks still help."""
    try:
        return fn()
    except Exception as exc:
        return [CheckResult(name, "warn", f"the check itself failed: {type(exc).__name__}: {exc}",
                            "please report this; the other rows are still valid")]


def run_checks(cfg: KforgeConfig, runs_dir: str | Path | None = None,
               triton_timeout_s: float = 300.0) -> list[CheckResult]:
    """Every check for this config, in a stable order."""
    runs_dir = Path(runs_dir if runs_dir is not None else cfg.log.runs_dir)
    all_gpus, source = query_gpus()
    gpus = visible_records(all_gpus) if all_gpus is not None else None
    gpus_visible = bool(gpus)
    probe = TritonProbe(gpus_visible, triton_timeout_s)  # runs while the quick checks below run
    head = check_python() + _guarded("packages", lambda: check_packages(cfg, gpus_visible))
    head += _guarded("placement", lambda: check_placement(cfg))
    tail = _guarded("sandbox", check_sandbox)
    tail += _guarded("problems", lambda: check_problems(cfg))
    # What `kforge train` checks before it makes a run folder, asked the same way.
    tail += _guarded("preflight", lambda: preflight(cfg, runs_dir, (gpus, source)))
    report, _ = probe.result()
    middle = _guarded("triton kernel", lambda: check_triton_and_torch(cfg, report, gpus_visible))
    middle += _guarded("cuda toolchain", lambda: check_cuda_toolchain(cfg, report.get("torch_cuda"), gpus_visible))
    return head + middle + tail
