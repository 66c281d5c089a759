"""The candidate corpus: which problem each file answers and what the evaluator must say about it.

Shared by tests/test_evaluator_corpus.py (CPU, Triton interpreter) and bench/gpu_evaluator_corpus.py.
Placeholders in a file (__PORT__, __TARGET__, __SLEEP__, __POOL_PID__) are filled in by the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).parent

RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)


def get_inputs():
    return [torch.rand(48, 40)]


def get_init_inputs():
    return []
'''

SCALE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, cols):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return x * self.weight


def get_inputs():
    return [torch.randn(16, 32)]


def get_init_inputs():
    return [32]
'''

PROBLEMS = {"relu": (1, 9001, "9001_Tiny_ReLU", RELU), "scale": (1, 9002, "9002_Tiny_Scale", SCALE)}


@dataclass(frozen=True)
class Case:
    file: str
    problem: str
    status: str  # the Status value expected
    flags: tuple[str, ...] = ()  # flags that must be present (prefix match)
    correct: bool = False
    gpu_only: bool = False
    cpu_only: bool = False
    backend: str = "triton"
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)
    # "all": every layer on. "bare": static checks and the audit hook off, so the case reaches the
    # kernel-level sandbox it tests (with every layer on, the static check rejects it first).
    mode: str = "all"

    def code(self) -> str:
        return (HERE / self.file).read_text()


CASES = [
    Case("relu_correct.py", "relu", "correct", correct=True),
    Case("scale_correct.py", "scale", "correct", correct=True, notes="reference weights copied into ModelNew"),
    Case("no_modelnew.py", "relu", "static_check_failed"),
    Case("pure_pytorch.py", "relu", "static_check_failed"),
    Case("syntax_error.py", "relu", "compile_error"),
    Case("import_error.py", "relu", "compile_error"),
    Case("kernel_not_launched.py", "relu", "correct", ("no_kernel_launched",)),
    Case("try_except_fallback.py", "relu", "correct", ("try_except_fallback", "pytorch_op:relu", "no_kernel_launched")),
    Case("calls_torch_op.py", "relu", "correct", ("pytorch_op:relu",)),
    Case("subclass_reference.py", "relu", "runtime_error", mode="bare", notes="the Model class never reaches the child"),
    Case("calls_reference.py", "relu", "runtime_error", mode="bare", notes="the Model class never reaches the child"),
    Case("returns_zeros.py", "relu", "incorrect"),
    Case("copy_kernel.py", "relu", "incorrect", ("returns_input",), notes="caught by the signed-input trial"),
    Case("memoise.py", "relu", "incorrect", ("identical_outputs_across_trials",)),
    Case("memoise_after_warmup.py", "relu", "correct", ("timed_output_mismatch",)),
    Case("alias_output.py", "relu", "correct", ("output_aliases_input",)),
    Case("monkeypatch_timer.py", "relu", "correct", ("patched:time.perf_counter", "patched:torch.cuda.synchronize"), mode="bare"),
    Case("wrong_shape.py", "relu", "incorrect"),
    Case("wrong_tail.py", "relu", "incorrect"),
    Case("relu_correct.py", "relu", "correct", correct=True, mode="sampled"),
    Case("wrong_tail.py", "relu", "incorrect", mode="sampled", notes="the last value is always among the positions"),
    Case("returns_zeros.py", "relu", "incorrect", mode="sampled"),
    Case("scale_correct.py", "scale", "correct", correct=True, mode="sampled"),
    Case("nan_output.py", "relu", "incorrect"),
    Case("read_other_memory.py", "relu", "correct", correct=True, mode="bare", notes="finds nothing to read: private /proc, no ptrace"),
    Case("env_secret.py", "relu", "runtime_error", mode="bare", notes="raises 'no secret visible' when the env is clean"),
    Case("write_outside.py", "relu", "runtime_error", mode="bare"),
    Case("network.py", "relu", "runtime_error", mode="bare"),
    Case("segfault.py", "relu", "crashed", mode="bare"),
    Case("hang.py", "relu", "timeout"),
    Case("detached_child.py", "relu", "correct", correct=True, mode="bare", notes="its detached process must be gone afterwards"),
    Case("huge_alloc.py", "relu", "runtime_error"),
    Case("illegal_access.py", "relu", "runtime_error|crashed", gpu_only=True, notes="illegal address: sticky CUDA error, fresh process next"),
    Case("side_stream.py", "relu", "correct", correct=True, gpu_only=True, notes="side-stream work is inside the timed window"),
    Case("cuda_relu_correct.py", "relu", "correct", correct=True, gpu_only=True, backend="cuda"),
    Case("cuda_relu_correct.py", "relu", "unsupported", cpu_only=True, backend="cuda"),
    Case("cuda_illegal_access.py", "relu", "runtime_error|crashed", gpu_only=True, backend="cuda"),
    Case("cuda_pure_pytorch.py", "relu", "correct", ("no_kernel_launched",), gpu_only=True, backend="cuda"),
]


# Attacks on the harness itself (tests/candidates/attacks/), written against kforge's own source.
# `expect` maps a pool mode to the verdict: "status", "status+flag+flag", or "rejected" (anything but
# correct-without-flags). Modes: "all" (every layer), "no_static" (static checks off, audit hook on),
# "bare" (both in-process layers off: only the parent's checks and the kernel-level sandbox remain).
MODES = {"all": {}, "no_static": {"static_checks": False}, "bare": {"static_checks": False, "audit_hook": False},
         # Every output counts as "too large to move": compared at sampled positions plus both ends.
         "sampled": {"full_compare_mb": 1e-6, "compare_points": 64}}


@dataclass(frozen=True)
class Attack:
    file: str
    expect: dict[str, str]
    notes: str = ""
    problem: str = "relu"

    def code(self) -> str:
        return (HERE / "attacks" / self.file).read_text()


def matches(want: str, verdict) -> bool:
    """Whether a Verdict is what an Attack.expect entry asks for."""
    if want == "rejected":
        return not verdict.correct
    status, *flags = want.split("+")
    return (verdict.status.value == status and all(f in verdict.flags for f in flags)
            and (bool(flags) or status != "correct" or verdict.correct))


ATTACKS = [
    Attack("forged_timing.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "the parent's clock around each timed batch disagrees with the forged report"),
    Attack("skip_timed_calls.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "recomputing outputs only when samples are asked still runs on the parent's clock"),
    Attack("chosen_trials.py", {"all": "static_check_failed", "bare": "rejected"},
           "the parent picks the order: an answer to a trial not asked ends the child (crashed, protocol_violation); "
           "when the signed trial comes first, the copy is simply incorrect"),
    Attack("message_flood.py", {"all": "static_check_failed", "bare": "crashed+protocol_violation"},
           "an unexpected message ends the child; nothing extends a deadline"),
    Attack("oversized_frame.py", {"all": "static_check_failed", "bare": "crashed+protocol_violation"},
           "a frame bigger than the expected outputs is refused before it is read"),
    Attack("slow_trials.py", {"all": "static_check_failed", "bare": "timeout"},
           "one budget for the whole trials stage"),
    Attack("reexec_reference.py", {"all": "static_check_failed", "no_static": "runtime_error", "bare": "runtime_error"},
           "audit hook refuses open/exec; without it the child has no Model to run"),
    Attack("read_cache.py", {"all": "static_check_failed", "no_static": "runtime_error", "bare": "runtime_error"},
           "Landlock: kforge's cache and checkout are not readable"),
    Attack("stderr_symlink.py", {"all": "static_check_failed", "bare": "crashed"},
           "the parent opens stderr.txt with O_NOFOLLOW: the link is not followed"),
    Attack("cache_poison.py", {"bare": "correct"}, "writes only into its own Triton cache copy and /dev/shm"),
    Attack("cache_check.py", {"bare": "correct"}, "must find nothing cache_poison.py left (run right after it)"),
    Attack("fake_jit.py", {"all": "static_check_failed"}, "the decorator must resolve to triton.jit"),
    Attack("token_launch.py", {"all": "correct+kernel_not_on_trial_data"},
           "the kernel never touched the trial's inputs or outputs"),
    Attack("forged_launch.py", {"all": "static_check_failed", "no_static": "runtime_error", "bare": "correct"},
           "with both in-process layers off, launch evidence can be forged: evidence, not a defence"),
    Attack("memo_probe.py", {"all": "correct"}, "every call (trials, warm-up, timed) gets inputs never seen before"),
    Attack("hang_when_timed.py", {"all": "correct+failed_when_timed"},
           "the timing stage has its own budget and the timing lock is released"),
    Attack("frame_walk.py", {"all": "static_check_failed", "no_static": "runtime_error"},
           "audit hook: frame inspection through inspect is the candidate's"),
    Attack("lazy_tensor.py", {"all": "static_check_failed", "no_static": "runtime_error", "bare": "runtime_error"},
           "a Tensor subclass computing only sampled elements: outputs must be plain tensors"),
    Attack("pipe_forgery.py", {"all": "correct+sandbox_denied:open:fd", "bare": "crashed+protocol_violation"},
           "numpy.savetxt to /proc/self/fd/N: the hook refuses fd paths; a forged frame is a protocol violation"),
    Attack("patch_launcher.py", {"all": "static_check_failed",
                                 "no_static": "correct+patched:triton.runtime.jit.JITFunction.run",
                                 "bare": "correct+patched:triton.runtime.jit.JITFunction.run"},
           "CPython audits no plain class-attribute assignment: the static check stops it, the identity "
           "check after each trial reports it"),
]

# GPU-time coverage (torch.profiler in the child; None on a CPU): the candidate's own kernels' share.
MATMUL_RELU = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(n, n))

    def forward(self, x):
        return torch.relu(torch.matmul(x, self.weight))


def get_inputs():
    return [torch.randn(1024, 1024)]


def get_init_inputs():
    return [1024]
'''
PROBLEMS["matmul_relu"] = (2, 9003, "9003_Matmul_ReLU", MATMUL_RELU)
COVERAGE = ["honest.py", "lazy.py", "decoy.py"]
