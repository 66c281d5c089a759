"""`kforge doctor`: torch, CUDA and Triton (probed in a subprocess), the CUDA toolchain, the sandbox."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kforge.config.schema import KforgeConfig
from kforge.kernel_backends import KERNEL_BACKENDS, cpu_backends
from kforge.ops.doctor_base import CheckResult, Status

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
    need = KERNEL_BACKENDS[cfg.dataset.backend].toolchain == "triton_probe"
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
    need = KERNEL_BACKENDS[cfg.dataset.backend].toolchain == "nvcc"
    miss: Status = "fail" if need else "pass"
    why = f"dataset.backend={cfg.dataset.backend}" if need else f"not needed: dataset.backend={cfg.dataset.backend}"
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
    if KERNEL_BACKENDS[cfg.dataset.backend].needs_gpu and not gpus_visible:
        rows.append(CheckResult(f"{cfg.dataset.backend} backend", "fail", f"dataset.backend={cfg.dataset.backend} but "
                                "no GPU is visible: candidates would all be reported as unsupported",
                                f"run on a GPU machine or set dataset.backend={cpu_backends()}"))
    return rows


# ------------------------------------------------------------------------------------------- sandbox


def check_sandbox() -> list[CheckResult]:
    try:
        from kforge.evaluator.layers import explain

        rows = explain()
    except Exception as exc:  # module missing or the probe failed: say so, the rest of the report still helps
        return [CheckResult("sandbox", "warn", f"could not probe the sandbox: {type(exc).__name__}: {exc}",
                            "candidate kernels may run with weaker isolation; see `kforge check --explain-sandbox`")]
    out = []
    for protection, active, detail in rows:
        out.append(CheckResult(f"sandbox: {protection}", "pass" if active else "warn", detail,
                               "" if active else "this layer is off on this machine; the other layers still apply"))
    return out
