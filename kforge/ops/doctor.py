"""`kforge doctor`: does this machine have what a run of a given config needs?

Each check returns rows of (check, status, detail, fix) with status pass / warn / fail; a run can start when
no row fails. The checks never initialise CUDA in this process (later forks of the eval zygote must stay
possible): GPUs are read through nvidia-smi or NVML, and torch/Triton are exercised in a subprocess.
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Literal

from kforge.config.schema import KforgeConfig
from kforge.gpus import Gpu, query_gpus

Status = Literal["pass", "warn", "fail"]
GIB = 1024**3


@dataclass
class CheckResult:
    check: str
    status: Status
    detail: str
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


def can_start(results: list[CheckResult]) -> bool:
    return not any(r.status == "fail" for r in results)


# ---------------------------------------------------------------------------------------------- needs


def gpu_reasons(cfg: KforgeConfig) -> list[str]:
    """The settings of this config that only work on an NVIDIA GPU."""
    reasons = []
    if cfg.rollout.backend == "vllm":
        reasons.append("rollout.backend=vllm")
    if cfg.model.load_in_4bit:
        reasons.append("model.load_in_4bit=true")
    if cfg.dataset.backend == "cuda":
        reasons.append("dataset.backend=cuda")
    if cfg.evaluator.measure_performance:
        reasons.append("evaluator.measure_performance=true (kernel timing)")
    return reasons


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
    raicl = cfg.dataset.prompt_option == "raicl"
    table: dict[str, tuple[str, str]] = {
        "torch": ("required", "everything"),
        "transformers": ("required", "model loading"),
        "peft": ("required", "the LoRA learner"),
        "triton": ("required", "dataset.backend=triton") if cfg.dataset.backend == "triton"
        else ("wanted", "Triton kernels"),
        "bitsandbytes": ("required", "model.load_in_4bit=true") if cfg.model.load_in_4bit
        else ("unused", "model.load_in_4bit=false"),
        "faiss": ("required", "prompt_option=raicl") if raicl else ("unused", f"prompt_option={cfg.dataset.prompt_option}"),
        "sentence-transformers": ("required", "prompt_option=raicl") if raicl
        else ("unused", f"prompt_option={cfg.dataset.prompt_option}"),
        "tensorboard": ("wanted", "log.tensorboard=true: without it metrics go to metrics.jsonl only")
        if cfg.log.tensorboard else ("unused", "log.tensorboard=false"),
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


def _visible_filter(gpus: list[Gpu]) -> list[Gpu]:
    """The GPUs CUDA_VISIBLE_DEVICES lets a process see (indices or GPU-UUID prefixes)."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return gpus
    chosen = []
    for item in [x.strip() for x in env.split(",") if x.strip()]:
        if item == "-1":
            break  # CUDA stops at the first invalid entry
        match = [g for g in gpus if g.index == item or (item.startswith("GPU-") and g.uuid.startswith(item))]
        if not match:
            if item.startswith("MIG-"):
                return gpus  # MIG instances are not listed per GPU here: show the physical GPUs
            break
        chosen.extend(m for m in match if m not in chosen)
    return chosen


def check_gpus(cfg: KforgeConfig, gpus: list[Gpu] | None, source: str) -> list[CheckResult]:
    needs = gpu_reasons(cfg)
    need_text = ", ".join(needs)
    if not gpus:
        hidden = os.environ.get("CUDA_VISIBLE_DEVICES") is not None and gpus is not None
        detail = "no GPU visible" + (f" ({source})" if gpus is None else "") + (
            " (CUDA_VISIBLE_DEVICES hides them)" if hidden else "")
        if needs:
            return [CheckResult("gpus", "fail", f"{detail}; this config needs one for {need_text}",
                                "run on an NVIDIA GPU machine with the driver installed, or use --preset tiny on CPU")]
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


# --------------------------------------------------------------------------------- torch, CUDA, Triton

TRITON_PROBE = r'''
import json, os, sys, time
out = {"stage": "import torch"}
def done(**kw):
    out.update(kw)
    print("KFORGE_PROBE " + json.dumps(out), flush=True)
    sys.exit(0)
t0 = time.time()
import torch
out.update(torch=torch.__version__, torch_cuda=torch.version.cuda)
use_gpu = os.environ.get("TRITON_INTERPRET") != "1"
if use_gpu:
    out["stage"] = "CUDA init"
    out["cuda_available"] = torch.cuda.is_available()
    out["device_count"] = torch.cuda.device_count() if out["cuda_available"] else 0
    if not out["cuda_available"]:
        done(ok=False, error="torch.cuda.is_available() is False")
    out["device_name"] = torch.cuda.get_device_name(0)
out["stage"] = "import triton"
import triton
import triton.language as tl
out["triton"] = triton.__version__

@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)

out["stage"] = "compile and run"
device = "cuda" if use_gpu else "cpu"
n = 1000
x = torch.arange(n, dtype=torch.float32, device=device)
y = torch.full((n,), 0.5, dtype=torch.float32, device=device)
o = torch.zeros_like(x)
t1 = time.time()
add_kernel[(triton.cdiv(n, 256),)](x, y, o, n, BLOCK=256)
if use_gpu:
    torch.cuda.synchronize()
ok = bool(torch.equal(o, x + y))
done(ok=ok, device=device, kernel_s=time.time() - t1, total_s=time.time() - t0,
     error="" if ok else "the kernel ran but returned wrong values")
'''


class TritonProbe:
    """A vector-add Triton kernel compiled and run in a child process (which may initialise CUDA freely).

    On a machine without a GPU the child runs under TRITON_INTERPRET=1 with CPU tensors. The child also
    reports torch's CUDA build and whether CUDA works, for the CUDA row.
    """

    def __init__(self, use_gpu: bool, timeout_s: float = 300.0):
        self.use_gpu = use_gpu
        self.timeout_s = timeout_s
        self._dir = tempfile.TemporaryDirectory(prefix="kforge-doctor-")
        # Triton's @jit reads the kernel's source file: the probe must be a real .py file, not `python -c`.
        script = Path(self._dir.name) / "kforge_triton_probe.py"
        script.write_text(TRITON_PROBE)
        env = dict(os.environ)
        if use_gpu:
            env.pop("TRITON_INTERPRET", None)
        else:
            env["TRITON_INTERPRET"] = "1"
        env["TRITON_CACHE_DIR"] = str(Path(self._dir.name) / "triton-cache")  # a cold compile, really tested
        self.started = time.time()
        self._proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env, cwd=self._dir.name)

    def result(self) -> tuple[dict, str]:
        """(the child's report, its stderr tail)."""
        try:
            stdout, stderr = self._proc.communicate(timeout=max(1.0, self.timeout_s - (time.time() - self.started)))
        except subprocess.TimeoutExpired:
            self._proc.kill()
            stdout, stderr = self._proc.communicate()
            return {"ok": False, "error": f"timed out after {self.timeout_s:.0f} s"}, stderr[-2000:]
        finally:
            self._dir.cleanup()
        for line in reversed(stdout.splitlines()):
            if line.startswith("KFORGE_PROBE "):
                return json.loads(line[len("KFORGE_PROBE "):]), stderr[-2000:]
        last = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        return {"ok": False, "error": last[-1] if last else f"exit code {self._proc.returncode}"}, stderr[-2000:]


def check_triton_and_torch(cfg: KforgeConfig, report: dict, gpus_visible: bool) -> list[CheckResult]:
    rows = []
    # torch's CUDA build
    torch_v, torch_cuda = report.get("torch"), report.get("torch_cuda")
    if torch_v is None:
        rows.append(CheckResult("torch", "fail", f"import torch failed: {report.get('error', '?')}",
                                "reinstall torch: pip install --force-reinstall torch"))
    elif gpus_visible:
        if not torch_cuda:
            rows.append(CheckResult("torch CUDA", "fail", f"torch {torch_v} is a CPU-only build but GPUs are visible",
                                    "install a CUDA build: pip install torch --index-url https://download.pytorch.org/whl/cu128"))
        elif report.get("cuda_available") is False:
            rows.append(CheckResult("torch CUDA", "fail",
                                    f"torch {torch_v} (CUDA {torch_cuda}) cannot use the GPU: {report.get('error', '')}",
                                    "the driver is older than torch's CUDA or CUDA_VISIBLE_DEVICES is wrong; "
                                    "update the driver or install a torch built for an older CUDA"))
        else:
            rows.append(CheckResult("torch CUDA", "pass", f"torch {torch_v}, CUDA {torch_cuda}, "
                                    f"{report.get('device_count', '?')} device(s), first: {report.get('device_name', '?')}"))
    else:
        # No GPU: the "gpus" row already says whether this config needs one.
        rows.append(CheckResult("torch CUDA", "pass", f"torch {torch_v}"
                                + (f" (CUDA {torch_cuda} build)" if torch_cuda else " (CPU build)") + ", no GPU to use"))
    # the kernel
    where = "on GPU 0" if gpus_visible else "in the Triton interpreter (TRITON_INTERPRET=1, CPU)"
    need = cfg.dataset.backend == "triton"
    if report.get("ok"):
        rows.append(CheckResult("triton kernel", "pass",
                                f"triton {report.get('triton')}: vector add compiled and ran {where} "
                                f"in {report.get('kernel_s', 0):.1f} s"))
    elif torch_v is not None:
        stage = report.get("stage", "?")
        fix = ("install a C compiler (gcc) and check that triton matches torch (pip install -U triton)"
               if gpus_visible else "pip install -U triton; the interpreter needs triton >= 3.0")
        rows.append(CheckResult("triton kernel", "fail" if need else "warn",
                                f"failed at '{stage}' {where}: {report.get('error', '?')}", fix))
    return rows


def _nvcc_path() -> str | None:
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc") or (
        "/usr/local/cuda/bin/nvcc" if Path("/usr/local/cuda/bin/nvcc").is_file() else None)


def nvcc_release(nvcc: str) -> str | None:
    try:
        out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    m = re.search(r"release (\d+\.\d+)", out)
    return m.group(1) if m else None


def check_cuda_toolchain(cfg: KforgeConfig, torch_cuda: str | None, gpus_visible: bool) -> list[CheckResult]:
    """nvcc, ninja and a C++ compiler: what `load_inline` needs for dataset.backend=cuda."""
    need = cfg.dataset.backend == "cuda"
    miss: Status = "fail" if need else "pass"
    why = "dataset.backend=cuda" if need else f"not needed: dataset.backend={cfg.dataset.backend}"
    rows = []
    nvcc = _nvcc_path()
    if nvcc is None:
        rows.append(CheckResult("nvcc", miss, f"not found ({why})",
                                "install the CUDA toolkit matching torch's CUDA and set CUDA_HOME" if need else ""))
    else:
        release = nvcc_release(nvcc)
        detail = f"{nvcc}: CUDA {release or '?'}"
        if need and torch_cuda and release and release.split(".")[0] != torch_cuda.split(".")[0]:
            rows.append(CheckResult("nvcc", "fail", f"{detail}, but torch is built for CUDA {torch_cuda}",
                                    f"install CUDA toolkit {torch_cuda.split('.')[0]}.x and point CUDA_HOME at it"))
        else:
            rows.append(CheckResult("nvcc", "pass", detail + ("" if need else f" ({why})")))
    ninja = shutil.which("ninja")
    if ninja is None and importlib.util.find_spec("ninja") is not None:
        ninja = "python package ninja"
    rows.append(CheckResult("ninja", "pass", ninja + ("" if need else f" ({why})")) if ninja else
                CheckResult("ninja", miss, f"not found ({why})", "pip install ninja" if need else ""))
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    rows.append(CheckResult("c++ compiler", "pass", cxx) if cxx else
                CheckResult("c++ compiler", miss, f"not found ({why})", "install g++ (apt-get install g++)" if need else ""))
    if need and not gpus_visible:
        rows.append(CheckResult("cuda backend", "fail", "dataset.backend=cuda but no GPU is visible: candidates would "
                                "all be reported as unsupported", "run on a GPU machine or set dataset.backend=triton"))
    return rows


# ------------------------------------------------------------------------------------------- sandbox


def check_sandbox() -> list[CheckResult]:
    try:
        from kforge.evaluator.sandbox import explain

        rows = explain()
    except Exception as exc:  # module missing or the probe failed: say so, the rest of the report still helps
        return [CheckResult("sandbox", "warn", f"could not probe the sandbox: {type(exc).__name__}: {exc}",
                            "candidate kernels may run with weaker isolation; see `kforge check --explain-sandbox`")]
    out = []
    for protection, active, detail in rows:
        out.append(CheckResult(f"sandbox: {protection}", "pass" if active else "warn", detail,
                               "" if active else "this layer is off on this machine; the other layers still apply"))
    return out


# --------------------------------------------------------------------------------------------- model


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def hub_cached(repo_id: str) -> str | None:
    """The local snapshot folder when the model's config and weights are in the Hugging Face cache."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    found = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(found, str):
        return None
    snap = Path(found).parent
    if any(snap.glob("*.safetensors")) or any(snap.glob("*.bin")) or any(snap.glob("*.gguf")):
        return str(snap)
    return None


def hub_head(repo_id: str, timeout_s: float = 5.0) -> tuple[int | None, str]:
    """HTTP status of the model's config.json on the hub (None when unreachable)."""
    url = f"{_hub_endpoint()}/{repo_id}/resolve/main/config.json"
    req = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, url
    except urllib.error.HTTPError as exc:
        return exc.code, url
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        return None, f"{url}: {getattr(exc, 'reason', exc)}"


def check_model(cfg: KforgeConfig, hub_timeout_s: float = 5.0) -> list[CheckResult]:
    from kforge.modelio import ModelLoadError, cache_root, resolve_model

    name = cfg.model.name
    rows = []
    try:
        ref = resolve_model(name, cfg.model.gguf_file, dense=False)  # dense=False: no 15 s GGUF conversion here
    except ModelLoadError as exc:
        return [CheckResult("model", "fail", str(exc).split("; run")[0], _fix_of(str(exc)))]
    folder = Path(os.path.expanduser(ref.path))
    if name.startswith("pkg:") or folder.is_dir():
        if ref.gguf_file:
            gguf = folder / ref.gguf_file
            if not gguf.is_file():
                return [CheckResult("model", "fail", f"{name}: no GGUF file {gguf}", "set model.gguf_file to a file in the folder")]
            cached = any((cache_root() / "models").glob(f"{gguf.stem}-*/config.json"))
            rows.append(CheckResult("model", "pass", f"{name}: {gguf} ({gguf.stat().st_size / 2**20:.0f} MiB GGUF; "
                                    + ("dense copy cached" if cached else "first run converts it to a dense copy, ~15 s")
                                    + ")"))
        elif (folder / "config.json").is_file() and (any(folder.glob("*.safetensors")) or any(folder.glob("*.bin"))):
            rows.append(CheckResult("model", "pass", f"local folder {folder}"))
        else:
            rows.append(CheckResult("model", "fail", f"{folder} has no config.json with weights (*.safetensors)",
                                    "point model.name at a Hugging Face model folder, a hub id, or pkg:<package>"))
    elif name.startswith(("/", "./", "../", "~")) or name.count("/") > 1:
        rows.append(CheckResult("model", "fail", f"model.name {name!r}: no such folder, and not a hub id (org/name)",
                                "give a local model folder, a hub id like Qwen/Qwen2.5-Coder-7B-Instruct, or pkg:<package>"))
    else:
        snap = hub_cached(name)
        if snap:
            rows.append(CheckResult("model", "pass", f"{name}: in the local Hugging Face cache ({snap})"))
        elif os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
            rows.append(CheckResult("model", "fail", f"{name}: not in the Hugging Face cache and HF_HUB_OFFLINE=1",
                                    f"download it first (`hf download {name}`) or point model.name at a local folder"))
        else:
            code, where = hub_head(name, hub_timeout_s)
            if code is not None and code < 400:
                rows.append(CheckResult("model", "pass", f"{name}: reachable on the hub (downloaded on first use)"))
            elif code in (401, 403):
                rows.append(CheckResult("model", "warn", f"{name}: the hub answered {code} (gated, private or misspelt)",
                                        "accept the licence on the model page and log in (`hf auth login`), "
                                        "or check the id"))
            elif code == 404:
                rows.append(CheckResult("model", "fail", f"{name}: not found on the hub", "check model.name"))
            else:
                rows.append(CheckResult("model", "warn", f"{name}: hub unreachable ({where}); not cached either",
                                        f"on a machine with internet: `hf download {name}`, or use a local folder"))
    if cfg.model.checkpoint:
        ck = Path(cfg.model.checkpoint)
        found = ck.is_dir() and (any(ck.rglob("adapter_config.json")))
        rows.append(CheckResult("model checkpoint", "pass" if found else "fail",
                                f"{ck}" + ("" if found else ": no adapter_config.json in it"),
                                "" if found else "point model.checkpoint at an adapter folder or a run checkpoint"))
    return rows


def _fix_of(message: str) -> str:
    m = re.search(r"run `([^`]+)`", message)
    return m.group(1) if m else "check model.name"


# ------------------------------------------------------------------------------------ problems, RAG, disk


def check_problems(cfg: KforgeConfig) -> list[CheckResult]:
    from kforge.problems import problems_from_config, split_problems

    ds = cfg.dataset
    try:
        problems = problems_from_config(ds)
        train, test = split_problems(problems, ds.test_fraction, ds.seed)
    except Exception as exc:  # ProblemSourceError and whatever a broken source raises: a run could not start
        return [CheckResult("problems", "fail", f"source {ds.source!r}: {exc}",
                            f"`kforge problems ls --source {ds.source}` shows what it holds; fix dataset.source/level")]
    if not train:
        return [CheckResult("problems", "fail", f"{len(problems)} problems but the training split is empty",
                            "lower dataset.test_fraction or select more problems")]
    return [CheckResult("problems", "pass", f"{len(problems)} from {ds.source!r} level {list(ds.level)}: "
                        f"{len(train)} train, {len(test)} held out")]


def _embedder_dim(folder: Path) -> int | None:
    """The output size of a sentence-transformers folder, read from its module configs (no model load)."""
    dim = None
    try:
        modules = json.loads((folder / "modules.json").read_text())
    except (OSError, json.JSONDecodeError):
        modules = []
    for mod in modules:
        cfg_file = folder / mod.get("path", "") / "config.json"
        try:
            conf = json.loads(cfg_file.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if mod.get("type", "").endswith("Pooling"):
            dim = conf.get("word_embedding_dimension", dim)
        elif mod.get("type", "").endswith("Dense"):
            dim = conf.get("out_features", dim)
    return dim


def _embedder_folder(name: str) -> Path | None:
    if name.startswith("pkg:"):
        spec = importlib.util.find_spec(name[4:])
        if spec is None or not spec.submodule_search_locations:
            return None
        base = Path(list(spec.submodule_search_locations)[0])
        return base / "model" if (base / "model").is_dir() else base
    if Path(name).is_dir():
        return Path(name)
    snap = hub_cached(name) if name.count("/") == 1 else None
    return Path(snap) if snap else None


def check_rag(cfg: KforgeConfig) -> list[CheckResult]:
    ds = cfg.dataset
    if ds.prompt_option != "raicl":
        return [CheckResult("rag index", "pass", f"not used (prompt_option={ds.prompt_option})")]
    build = f"kforge rag build --backend {ds.backend}"
    if not ds.rag_index_path:
        return [CheckResult("rag index", "fail", "prompt_option=raicl but dataset.rag_index_path is not set",
                            f"{build}, then set dataset.rag_index_path to its folder")]
    folder = Path(ds.rag_index_path)
    if not folder.is_dir():
        return [CheckResult("rag index", "fail", f"no index folder {folder} (relative to {Path.cwd()})",
                            f"{build} (or set dataset.rag_index_path to an existing index)")]
    try:
        manifest = json.loads((folder / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [CheckResult("rag index", "fail", f"{folder}/manifest.json unreadable: {exc}", f"rebuild it: {build}")]
    rows = []
    try:
        import kforge.rag as rag

        if not hasattr(rag, "load_retriever"):
            rows.append(CheckResult("rag code", "fail", "kforge.rag has no load_retriever in this install",
                                    "update kforge; RA-ICL prompts are not available in this version"))
    except ImportError as exc:
        rows.append(CheckResult("rag code", "fail", f"kforge.rag does not import: {exc}", "pip install 'kforge[rag]'"))
    embedder = next((manifest[k] for k in ("embedder", "embedding_model", "embed_model", "model") if manifest.get(k)), None)
    dim = next((manifest[k] for k in ("dim", "dimension", "embedding_dim") if isinstance(manifest.get(k), int)), None)
    index_files = sorted(folder.glob("*.faiss")) or sorted(folder.glob("index*"))
    if not index_files:
        return rows + [CheckResult("rag index", "fail", f"{folder}: manifest but no *.faiss index file", f"rebuild: {build}")]
    index_dim, count = None, None
    if importlib.util.find_spec("faiss") is not None:
        try:
            import faiss

            index = faiss.read_index(str(index_files[0]))
            index_dim, count = int(index.d), int(index.ntotal)
        except Exception as exc:  # a corrupt or foreign file
            return rows + [CheckResult("rag index", "fail", f"{index_files[0]}: faiss cannot read it: {exc}",
                                       f"rebuild: {build}")]
    emb_folder = _embedder_folder(str(embedder)) if embedder else None
    emb_dim = _embedder_dim(emb_folder) if emb_folder else None
    problems = []
    if embedder and emb_folder is None:
        problems.append(f"embedder {embedder} is not available locally")
    if dim is not None and index_dim is not None and dim != index_dim:
        problems.append(f"manifest dim {dim} != index dim {index_dim}")
    if emb_dim is not None and (index_dim or dim) is not None and emb_dim != (index_dim or dim):
        problems.append(f"embedder {embedder} gives {emb_dim}-d vectors, index holds {index_dim or dim}-d")
    detail = f"{folder}: {count if count is not None else '?'} vectors, dim {index_dim or dim or '?'}, embedder {embedder or '?'}"
    if problems:
        rows.append(CheckResult("rag index", "fail", detail + "; " + "; ".join(problems),
                                f"rebuild with the embedder you use: {build}"))
    else:
        rows.append(CheckResult("rag index", "pass", detail))
    return rows


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def check_disk(runs_dir: Path, fail_below_gib: float = 1.0, warn_below_gib: float = 10.0) -> list[CheckResult]:
    where = _existing_parent(Path(runs_dir))
    free = shutil.disk_usage(where).free / GIB
    if not os.access(where, os.W_OK):
        return [CheckResult("disk", "fail", f"{where} is not writable (runs go to {runs_dir})",
                            "pass --runs-dir / log.runs_dir=DIR pointing at a writable folder")]
    detail = f"{free:.1f} GiB free at {where} (runs go to {runs_dir})"
    if free < fail_below_gib:
        return [CheckResult("disk", "fail", detail, f"free space or choose another log.runs_dir (needs >= {fail_below_gib:g} GiB)")]
    if free < warn_below_gib:
        return [CheckResult("disk", "warn", detail, f"checkpoints and merged exports of big models need more than "
                            f"{warn_below_gib:g} GiB; free space or choose another log.runs_dir")]
    return [CheckResult("disk", "pass", detail)]


# -------------------------------------------------------------------------------------------- driver


def _guarded(name: str, fn: Callable[[], list[CheckResult]]) -> list[CheckResult]:
    """A check that crashes is reported, not fatal: the other checks still help."""
    try:
        return fn()
    except Exception as exc:
        return [CheckResult(name, "warn", f"the check itself failed: {type(exc).__name__}: {exc}",
                            "please report this; the other rows are still valid")]


def run_checks(cfg: KforgeConfig, runs_dir: str | Path | None = None, triton_timeout_s: float = 300.0,
               hub_timeout_s: float = 5.0) -> list[CheckResult]:
    """Every check for this config, in a stable order."""
    runs_dir = Path(runs_dir if runs_dir is not None else cfg.log.runs_dir)
    all_gpus, source = query_gpus()
    gpus = _visible_filter(all_gpus) if all_gpus is not None else None
    gpus_visible = bool(gpus)
    probe = TritonProbe(gpus_visible, triton_timeout_s)  # runs while the quick checks below run
    head = check_python() + _guarded("packages", lambda: check_packages(cfg, gpus_visible))
    head += _guarded("gpus", lambda: check_gpus(cfg, gpus, source))
    tail = _guarded("sandbox", check_sandbox)
    tail += _guarded("model", lambda: check_model(cfg, hub_timeout_s))
    tail += _guarded("problems", lambda: check_problems(cfg))
    tail += _guarded("rag index", lambda: check_rag(cfg))
    tail += _guarded("disk", lambda: check_disk(runs_dir))
    report, _ = probe.result()
    middle = _guarded("triton kernel", lambda: check_triton_and_torch(cfg, report, gpus_visible))
    middle += _guarded("cuda toolchain", lambda: check_cuda_toolchain(cfg, report.get("torch_cuda"), gpus_visible))
    return head + middle + tail
