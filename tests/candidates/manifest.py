"""The candidate corpus: which problem each file answers and what the evaluator must say about it.

Shared by tests/evaluator/test_corpus.py (CPU, Triton interpreter) and bench/gpu_evaluator_corpus.py.
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

# KernelBench's MinGPT GELU (level 1, 88) at a small size: its reference calls math.sqrt and torch.tanh.
TANH_GELU = '''import math

import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def get_inputs():
    return [torch.randn(24, 40)]


def get_init_inputs():
    return []
'''

# KernelBench's softmax (level 1, 23) at a small size: the reference spells the op `torch.softmax`.
SOFTMAX = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return []
'''

MSE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    # 4 MB per input: on a GPU the sum kernel outlasts PyTorch's one-value division, as at KernelBench's sizes
    return [torch.randn(1024, 1024), torch.randn(1024, 1024)]


def get_init_inputs():
    return []
'''

# A small output from large inputs (KernelBench's matrix-vector product, level 1, 4, at a small size).
MATVEC = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, a, b):
        return torch.matmul(a, b)


def get_inputs():
    return [torch.randn(32, 1024), torch.randn(1024, 1)]


def get_init_inputs():
    return []
'''

PROBLEMS = {"relu": (1, 9001, "9001_Tiny_ReLU", RELU), "scale": (1, 9002, "9002_Tiny_Scale", SCALE),
            "tanh_gelu": (1, 9004, "9004_Tiny_TanhGELU", TANH_GELU), "softmax": (1, 9005, "9005_Tiny_Softmax", SOFTMAX),
            "mse": (1, 9006, "9006_Small_MSELoss", MSE), "matvec": (1, 9007, "9007_Small_MatVec", MATVEC)}


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
    Case("loss_correct.py", "mse", "correct", correct=True,
         notes="a one-value result PyTorch finished (acc / n): the kernel did the work"),
    Case("scale_correct.py", "scale", "correct", correct=True, notes="reference weights copied into ModelNew"),
    Case("ordinary_gelu.py", "tanh_gelu", "correct", correct=True,
         notes="two kernels, a jit helper, views, math.sqrt(2 / pi) in the launch arguments"),
    Case("ordinary_autotune.py", "tanh_gelu", "correct", correct=True, gpu_only=True,
         notes="@triton.autotune (the CPU interpreter cannot autotune)"),
    Case("no_modelnew.py", "relu", "static_check_failed"),
    Case("pure_pytorch.py", "relu", "static_check_failed"),
    Case("syntax_error.py", "relu", "compile_error"),
    Case("import_error.py", "relu", "compile_error"),
    Case("checks_own_output.py", "relu", "correct", correct=True,
         notes="raises in the decoy trial (kernel skipped): a fresh child runs the remaining trials"),
    Case("kernel_not_launched.py", "relu", "correct", ("no_kernel_launched",)),
    Case("try_except_fallback.py", "relu", "correct", ("try_except_fallback", "pytorch_op:relu", "no_kernel_launched")),
    Case("calls_torch_op.py", "relu", "correct", ("pytorch_op:relu",)),
    Case("subclass_reference.py", "relu", "compile_error", mode="bare",
         notes="the Model class never reaches the child; it fails at import, before READY"),
    Case("calls_reference.py", "relu", "compile_error", mode="bare",
         notes="the Model class never reaches the child; it fails in its first call, which never answered"),
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
    Case("env_secret.py", "relu", "compile_error", mode="bare", notes="raises 'no secret visible' when the env is clean "
         "(in its first call: no call answered, nothing known to have compiled)"),
    Case("write_outside.py", "relu", "compile_error", mode="bare", notes="Landlock refuses the write at import"),
    Case("network.py", "relu", "compile_error", mode="bare"),
    Case("segfault.py", "relu", "compile_error", mode="bare", notes="dies in its first call"),
    Case("hang.py", "relu", "compile_error", notes="hangs in its first call: the run budget ends it"),
    Case("detached_child.py", "relu", "compile_error|runtime_error", mode="bare",
         notes="fork after the lock-down is refused: in its first call on the CPU (no call answered: compile_error), "
               "in a later one on a GPU, where the lock-down waits for the first trial and kills what it left; its "
               "detached process must be gone afterwards"),
    Case("huge_alloc.py", "relu", "compile_error"),
    Case("illegal_access.py", "relu", "compile_error", gpu_only=True,
         notes="illegal address in its first call: sticky CUDA error, fresh process next"),
    Case("side_stream.py", "relu", "correct", correct=True, gpu_only=True, notes="side-stream work is inside the timed window"),
    Case("cuda_relu_correct.py", "relu", "correct", correct=True, gpu_only=True, backend="cuda"),
    Case("cuda_relu_correct.py", "relu", "unsupported", cpu_only=True, backend="cuda"),
    Case("cuda_illegal_access.py", "relu", "compile_error", gpu_only=True, backend="cuda"),
    Case("cuda_pure_pytorch.py", "relu", "correct", ("no_kernel_launched",), gpu_only=True, backend="cuda"),
    Case("attacks/build_folder_write.py", "relu", "correct", correct=True, gpu_only=True, backend="cuda", mode="bare",
         notes="its built folder is read-only to it: a write there would make it answer zeros"),
]


# Attacks on the harness itself (tests/candidates/attacks/), written against kforge's own source.
# `expect` maps a pool mode to the verdict: "status", "status+flag+flag", or "rejected" (anything but
# correct-without-flags); "a|b" accepts either (where the outcome depends on the machine: root or not). Modes: "all" (every layer), "no_static" (static checks off, audit hook on),
# "bare" (both in-process layers off: only the parent's checks and the kernel-level sandbox remain).
MODES = {"all": {}, "no_static": {"static_checks": False}, "bare": {"static_checks": False, "audit_hook": False},
         # Every output counts as "too large to move": compared at sampled positions plus both ends.
         "sampled": {"full_compare_mb": 1e-6, "compare_points": 64},
         # Every layer on, with a short import budget: for a candidate that spins at import.
         "short_import": {"compile_timeout_s": 15.0}}


@dataclass(frozen=True)
class Attack:
    file: str
    expect: dict[str, str]
    notes: str = ""
    problem: str = "relu"
    # The item of the README's threat model it attacks (1: who answers the parent's samples, 2: laundering
    # through a library, 3: timing, 4: a launch is not work, 5: the sandbox under root, 6: failure category,
    # 7: every evaluation independent).
    item: int = 0
    # What a GPU run must give instead, per mode, where the GPU legitimately differs (never `correct`
    # without a flag where the CPU's expectation is not).
    gpu: dict[str, str] = field(default_factory=dict)
    cpu_only: bool = False  # the trick needs host memory (a GPU run skips it)

    def code(self) -> str:
        return (HERE / "attacks" / self.file).read_text()

    def want(self, mode: str, on_gpu: bool) -> str:
        return self.gpu.get(mode, self.expect[mode]) if on_gpu else self.expect[mode]


RATIO = 2.0  # EvaluatorConfig.timing_ratio's default, which every corpus run uses


def _has(verdict, flag: str) -> bool:
    """A flag, or one of two findings about the timing figure that are not flags (they void no reward):
    `clamped`: the figure is the parent's clock's floor, not the report (timing_check.check_timing);
    `bounded`: the speedup is at most RATIO x what the parent's clock saw (the two least walls per call)."""
    if flag == "clamped":
        return bool(verdict.details.get("timing_clamped"))
    if flag == "bounded":
        seen = verdict.details.get("clock_speedup")
        return verdict.speedup is not None and seen is not None and verdict.speedup <= RATIO * seen * 1.001
    return flag in verdict.flags


def matches(want: str, verdict) -> bool:
    """Whether a Verdict is what an Attack.expect entry asks for ("a|b": either)."""
    if "|" in want:
        return any(matches(w, verdict) for w in want.split("|"))
    if want == "rejected":
        return not verdict.correct
    status, *flags = want.split("+")
    return (verdict.status.value == status and all(_has(verdict, f) for f in flags)
            and (bool(flags) or status != "correct" or verdict.correct))


ATTACKS = [
    Attack("forged_timing.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "the parent's clock around each timed call disagrees with the forged report; on a GPU, where a tiny kernel is lost in the loop's ~1 ms overhead, the clock cannot flag it: the figure is then its floor (`clamped`: at most RATIO x the speedup the parent's clock saw)", item=3,
           gpu={"bare": "correct+timing_inconsistent|correct+clamped"}),
    Attack("skip_unchecked_call.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "the parent's least time per call counts only compared calls: the one call that computed nothing (the "
           "21st, which a draw leaves unchecked 9 in 10 times) no longer sets it. On a CPU every one of the 3 timed "
           "calls is compared and the forged report is flagged; on a GPU as forged_timing.py, or the skipped call "
           "was compared", item=3,
           gpu={"bare": "correct+timing_inconsistent|correct+clamped|correct+timed_output_mismatch"}),
    Attack("skip_timed_calls.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "computing outputs only when they are copied out still runs on the parent's clock; on a GPU, where a tiny kernel is lost in the loop's ~1 ms overhead, the clock cannot flag it: the figure is then its floor (`clamped`: at most RATIO x the speedup the parent's clock saw)",
           item=3, gpu={"bare": "correct+timing_inconsistent|correct+clamped"}),
    Attack("chosen_trials.py", {"all": "static_check_failed", "bare": "rejected"},
           "the parent picks the order: an answer to a trial not asked ends the child (protocol_violation); "
           "when the signed trial comes first, the copy is simply incorrect"),
    Attack("message_flood.py", {"all": "static_check_failed", "bare": "compile_error+protocol_violation"},
           "an unexpected message ends the child; nothing extends a deadline"),
    Attack("oversized_frame.py", {"all": "static_check_failed", "bare": "compile_error+protocol_violation"},
           "a frame bigger than the expected outputs is refused before it is read"),
    Attack("slow_trials.py", {"all": "static_check_failed", "bare": "timeout"},
           "one budget for the whole trials stage"),
    Attack("reexec_reference.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "audit hook refuses open/exec; without it the child has no Model to run (at import: compile_error)"),
    Attack("read_cache.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "Landlock: kforge's cache and checkout are not readable"),
    Attack("stderr_symlink.py", {"all": "static_check_failed", "bare": "compile_error"},
           "the parent opens stderr.txt with O_NOFOLLOW: the link is not followed"),
    Attack("cache_poison.py", {"bare": "correct"}, "writes only into its own Triton cache copy and /dev/shm"),
    Attack("cache_check.py", {"bare": "correct"}, "must find nothing cache_poison.py left (run right after it)"),
    Attack("fake_jit.py", {"all": "static_check_failed"}, "the decorator must resolve to triton.jit"),
    Attack("token_launch.py", {"all": "correct+kernel_not_on_trial_data"},
           "the kernel never touched the trial's inputs or outputs"),
    Attack("forged_launch.py", {"all": "static_check_failed", "no_static": "compile_error",
                                "bare": "correct+kernel_not_needed"},
           "with both in-process layers off, launch evidence can be forged: evidence, not a defence; the decoy "
           "trial (its kernels skipped, outputs still right) catches PyTorch doing the work"),
    Attack("memo_probe.py", {"all": "correct"}, "every call (trials, warm-up, timed) gets inputs never seen before"),
    Attack("hang_when_timed.py", {"all": "correct+failed_when_timed"},
           "the timing stage has its own budget and the timing lock is released"),
    Attack("frame_walk.py", {"all": "static_check_failed", "no_static": "compile_error"},
           "audit hook: frame inspection through inspect is the candidate's"),
    Attack("lazy_tensor.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "a Tensor subclass computing only sampled elements: outputs must be plain tensors", item=1),
    Attack("pipe_forgery.py", {"all": "static_check_failed", "no_static": "correct+sandbox_denied:open:fd",
                               "bare": "correct|compile_error+protocol_violation"},
           "numpy.savetxt to /proc/self/fd/N: banned in source; the hook refuses fd paths; with neither, the "
           "unprivileged child cannot reopen the parent's pipe (it belongs to root), and a forged frame would be "
           "a protocol violation"),
    Attack("patch_launcher.py", {"all": "static_check_failed",
                                 "no_static": "correct+patched:triton.runtime.jit.JITFunction.run",
                                 "bare": "correct+patched:triton.runtime.jit.JITFunction.run"},
           "CPython audits no plain class-attribute assignment: the static check stops it, the identity "
           "check after each trial reports it. On a GPU the no-op launcher really skips the kernel (the "
           "interpreter launches through another class): its outputs are never written, `incorrect`",
           gpu={m: "incorrect+patched:triton.runtime.jit.JITFunction.run|correct+patched:triton.runtime.jit."
                   "JITFunction.run" for m in ("no_static", "bare")}),
    # One per item of the threat model (`item`). Under the old harness (the parent asked the child for values at
    # its positions, timing by median, no decoy trial, children as root) each got `correct` with no flag
    # in at least one of these modes.
    Attack("lazy_mode.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "a TorchFunctionMode answered the samples from the inputs; the parent now reads the outputs itself, and "
           "a call that returns with a mode entered is an error", item=1),
    Attack("library_index.py", {"all": "static_check_failed", "no_static": "correct+timed_output_mismatch",
                                "bare": "correct+timed_output_mismatch"},
           "torch.library re-registered the indexing op that answered the samples; now nothing in the child is asked",
           item=1),
    Attack("late_writer.py", {"all": "static_check_failed", "bare": "correct+timed_output_mismatch"},
           "a thread writes the outputs after the answer: every thread is frozen before the parent reads", item=1),
    Attack("launder_numpy.py", {"all": "static_check_failed", "no_static": "compile_error",
                                "bare": "correct+kernel_not_needed"},
           "numpy.load unpickles exec: no unpickling with a candidate frame on the stack; without the hook the "
           "forged launch evidence is met by the decoy trial", item=2),
    Attack("launder_torch_load.py", {"all": "static_check_failed", "no_static": "compile_error",
                                     "bare": "correct+kernel_not_needed"},
           "torch.load of an in-memory pickle: same", item=2),
    Attack("dataclass_launder.py", {"all": "static_check_failed", "no_static": "compile_error",
                                    "bare": "correct+kernel_not_needed"},
           "a dataclass default factory calls gc.get_objects from a `<string>` frame: such frames are the candidate's",
           item=2),
    Attack("ctypes_launder.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "ctypes reached through numpy.ctypeslib, every step asked from np.vectorize's frame: the audit hook sees "
           "numpy; libc's system() after READY is refused by the seccomp filter applied then (in the first call: compile_error, no "
           "call answered; on a GPU the first trial runs before the lock-down, so a later call fails)", item=2,
           gpu={"no_static": "runtime_error", "bare": "runtime_error"}),
    Attack("collect_env_shell.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "a shell through torch.utils.collect_env.run (Popen in torch's file): refused by the seccomp filter "
           "applied at READY (on a GPU with Triton, after the first trial: its first call succeeds, the next fails)",
           item=2, gpu={"no_static": "runtime_error", "bare": "runtime_error"}),
    Attack("from_file_read.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "torch.from_file raises no audit event: the second Landlock layer applied at READY leaves the user "
           "list (/etc/passwd) out", item=2, gpu={"no_static": "runtime_error", "bare": "runtime_error"}),
    Attack("thread_before_lockdown.py", {"all": "static_check_failed", "no_static": "compile_error",
                                         "bare": "compile_error"},
           "a thread started at import outlived the lock-down: the filter was loaded for the main thread only and "
           "Landlock restricts the thread that asks, so after READY it forked, exec'd a shell, made System V "
           "shared memory and read the user list (`correct`, no flag, with both in-process layers off). Now the "
           "filter holds for every thread (TSYNC) and a thread started after the set-up ends the child at the "
           "lock-down (before READY on a CPU, after the first call on a GPU: compile_error either way, the H100 "
           "showed it). With the audit hook on, its thread is refused everything it asks at import and never "
           "starts", item=5),
    Attack("native_build_thread.py", {"all": "static_check_failed", "no_static": "compile_error",
                                      "bare": "compile_error"},
           "C compiled and loaded at import through triton.runtime.build (Triton's frame asks, so the audit hook "
           "allows it): the library's thread did the same as thread_before_lockdown.py's, unseen by the "
           "interpreter (`correct`, no flag, with every layer on). Native builds are banned in source now; "
           "without the static check the thread ends the child at the lock-down (compile_error on a CPU and on "
           "an H100)", item=2),
    Attack("skewed_timing.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "a report whose mean agrees and median does not: both are compared, the mean is the figure. On a GPU "
           "the clock cannot resolve the median of a tiny kernel; the mean (honest) is the figure, bounded by "
           "the clock", item=3, gpu={"bare": "correct+timing_inconsistent|correct+bounded"}),
    Attack("copy_then_torch_loss.py", {"bare": "correct"},
           "a copy kernel the answer depends on, then PyTorch's own loss of the copy: a small output PyTorch made, "
           "as an honest loss's `acc / n` is; the profiled call's GPU time decides, so only a GPU tells them apart "
           "(on a CPU nothing is measured, and only correctness is rewarded there: a gap the README names; with "
           "every layer on the same holds, flagged on an H200 too)", problem="mse", item=4,
           gpu={"bare": "correct+output_not_from_kernel"}),
    Attack("count_profile.py", {"all": "correct+timed_call_without_kernel", "bare": "correct+timed_call_without_kernel"},
           "counting calls, PyTorch alone answers the timed calls and a spin kernel pads the call it expects to be "
           "profiled: every timed call now carries its own launch evidence, and the profiled call is one of the "
           "timed calls at a random place", item=3),
    Attack("weakref_callback.py", {"all": "correct+timed_output_mismatch", "bare": "correct+timed_output_mismatch"},
           "the work hung on a weakref callback of the input, once fired by the harness's `del inputs` before the "
           "copy-out: inputs and outputs now stay referenced (and the collector off) until the parent has read "
           "the outputs, so the copy holds what the window computed", item=3),
    Attack("nonpositive_timing.py", {"all": "static_check_failed", "bare": "correct+timing_inconsistent"},
           "negative reported times are no report", item=3),
    Attack("alias_op.py", {"all": "correct+pytorch_op:relu", "no_static": "correct+kernel_not_needed",
                           "bare": "correct+kernel_not_needed"},
           "the op under an imported alias is resolved; the decoy trial (kernels skipped) is still right", item=4),
    Attack("softmax_module.py", {"all": "correct+pytorch_op:Softmax+output_not_from_kernel",
                                 "bare": "correct+output_not_from_kernel"},
           "a copy kernel, then the reference op as a module (`nn.Softmax(dim=-1)(y)`): the op check resolves every "
           "spelling to one op; the kernel is needed (the decoy trial sees garbage without it), but the output "
           "was never handed to a kernel of the candidate's", problem="softmax", item=4),
    Attack("work_elsewhere.py", {"all": "correct+kernel_not_needed", "bare": "correct+kernel_not_needed"},
           "a kernel on the trial's tensors while PyTorch (another op) writes the answer: the decoy trial", item=4),
    Attack("aten_op.py", {"all": "static_check_failed", "bare": "correct+output_not_from_kernel"},
           "torch.ops.aten is banned in source; without the static check the kernel's copy is needed (the decoy "
           "trial sees it), but the output is PyTorch's relu of it, which no kernel of the candidate's wrote",
           item=4),
    Attack("copy_then_clamp.py", {"all": "correct+output_not_from_kernel", "bare": "correct+output_not_from_kernel"},
           "a copy kernel into the output it allocated, then PyTorch's `out.clamp_min_(0.0)` into that same tensor: "
           "the output was handed to a kernel, so it counted as the kernel's. What a kernel of the candidate's "
           "wrote last into the output's storage must be what is returned", item=4),
    Attack("copy_then_log_softmax.py", {"all": "correct+output_not_from_kernel",
                                        "bare": "correct+output_not_from_kernel"},
           "the same on softmax: `out.copy_(torch.log_softmax(out, -1).exp())` after a copy kernel into `out`",
           problem="softmax", item=4),
    Attack("zeros_then_einsum.py", {"all": "correct+output_not_from_kernel", "bare": "correct+output_not_from_kernel"},
           "a kernel zero-fills a small output, then `out.add_(torch.einsum(...))` computes all of it: a kernel "
           "touched the output, so its GPU share was never asked (on a CPU nothing measures it)", problem="matvec",
           item=4),
    Attack("module_alias_patch.py", {"all": "static_check_failed", "no_static": "compile_error",
                                     "bare": "incorrect+returns_input"},
           "`t = torch; t.frombuffer = f`: the harness's copy-out into the arena, looking the function up at call "
           "time, wrote relu of a copy kernel's output. Renames resolve in the static check, modules loaded "
           "before the candidate refuse a replaced attribute, and the copy-out binds its functions at import",
           item=4),
    Attack("module_alias_equal.py", {"all": "static_check_failed", "no_static": "compile_error",
                                     "bare": "correct+output_not_from_kernel"},
           "copy_then_clamp.py with `torch.equal` replaced through a rename, so the written-bytes comparison "
           "never differed", item=4),
    Attack("module_thaw.py", {"all": "static_check_failed", "no_static": "compile_error",
                              "bare": "correct+output_not_from_kernel"},
           "module_alias_equal.py after swapping the frozen module's class back through `object.__setattr__`: "
           "an audit event on a protected module, refused", item=4),
    Attack("mode_left_entered.py", {"all": "compile_error", "no_static": "compile_error", "bare": "compile_error"},
           "a TorchFunctionMode of a library path kept entered after forward answered the harness's copy into the "
           "arena: a call that returns with a new mode entered is an error", item=1),
    Attack("update_wrapper_module.py", {"all": "static_check_failed", "no_static": "compile_error",
                                        "bare": "compile_error"},
           "update_wrapper wrote a Tensor subclass into torch's own dict past the frozen module; the loop binds "
           "torch.Tensor at import", item=1),
    Attack("dispatch_override.py", {"all": "static_check_failed", "no_static": "compile_error",
                                     "bare": "compile_error"},
           "a Python kernel for aten::copy_ answered the harness's copy into the arena: the ops the harness uses "
           "are sealed before the candidate's code runs", item=1),
    Attack("mode_at_import.py", {"all": "compile_error", "no_static": "compile_error", "bare": "compile_error"},
           "a mode entered at import forged written.py's sample: the baseline of modes is taken before the "
           "candidate's code runs, and samples run with every mode off", item=4),
    Attack("python_dispatcher.py", {"all": "static_check_failed", "no_static": "compile_error",
                                     "bare": "compile_error"},
           "a py_impl kernel for aten.copy_ with the Python dispatcher kept on answered the copy into the arena: "
           "sealed, part of the baseline, switched off for the harness's calls", item=1),
    Attack("seal_gap_empty_like.py", {"all": "static_check_failed", "no_static": "correct+output_not_from_kernel",
                                      "bare": "correct+output_not_from_kernel"},
           "a C++ kernel for an op outside the sealed list, through a re-export of torch.library", item=4),
    Attack("storage_swap.py", {"all": "correct+output_not_from_kernel", "bare": "correct+output_not_from_kernel"},
           "the sampled storage's bytes moved by `share_memory_()` while a numpy array keeps its old memory, "
           "where PyTorch writes the answer: an output over the address of a storage that moved is overwritten",
           # On a GPU the kernel's buffer is a CUDA copy of the array, which `share_memory_()` cannot move, and
           # the answer comes back on the CPU: an H200 gave compile_error in both modes.
           item=4, cpu_only=True),
    Attack("storage_reuse.py", {"all": "correct+output_not_from_kernel", "bare": "correct+output_not_from_kernel"},
           "the sampled storage freed in place (`resize_(0)`) and its address handed to PyTorch's answer",
           item=4),
    Attack("clamp_then_noop_launch.py", {"all": "correct+output_not_from_kernel",
                                         "bare": "correct+output_not_from_kernel"},
           "copy_then_clamp.py with a launch that writes nothing after the clamp: bytes written between launches "
           "stay foreign until a launch changes them", item=4),
    Attack("root_files.py", {"bare": "compile_error"},
           "runs as an unprivileged uid: no shadow file, no writable /proc/sys or /sys; error text capped", item=5),
    Attack("host_text.py", {"bare": "compile_error"},
           "an error message made of the host (environment block, user list, kernel release, CPU count): the text "
           "that reaches a prompt is built from the candidate's own source lines, the exception type and a bounded "
           "message of the candidate's words and kforge's vocabulary", item=5),
    Attack("host_text_forged.py", {"bare": "compile_error"},
           "forged frames and compiler lines: a frame's line number spelling torch's git hash, a compiler line's "
           "file name spelling the virtualenv's path, eight compiler lines of 200 characters; only the "
           "candidate's real lines, load_inline's own files and 300 characters of messages reach the text", item=5),
    Attack("host_environ.py", {"bare": "correct"},
           "the child's environment block (/proc/self/environ) held the zygote's PYTHONPATH (the checkout) and the "
           "trainer's PATH: it now holds nothing of the host", item=5),
    Attack("import_reraise.py", {"all": "compile_error", "bare": "compile_error"},
           "an error before READY is a compile error, whatever the child calls it", item=6),
    Attack("import_crash.py", {"all": "static_check_failed", "no_static": "compile_error", "bare": "compile_error"},
           "a child that ends itself before READY never compiled: compile_error, not crashed (which was worth "
           "the compile reward)", item=6),
    Attack("compile_reraise.py", {"all": "compile_error", "bare": "compile_error"},
           "a kernel that does not compile, its failure re-raised as RuntimeError in forward: the child's exception "
           "class once decided (runtime_error, worth the compile reward); only a call that ran to its answer shows "
           "that the code compiled", item=6),
    Attack("compile_after_zeros.py", {"all": "compile_error", "bare": "compile_error"},
           "answers its first call with zeros and no kernel, then launches a kernel that does not compile: any "
           "answered call counted as compiled (`runtime_error`, worth the compile reward). Only a call answered "
           "with a kernel of the candidate's launched on its data shows that it compiled", item=6),
    Attack("compile_fails.py", {"all": "compile_error", "bare": "compile_error"},
           "the control: compile_after_zeros.py without its first answer", item=6),
    Attack("import_hang.py", {"short_import": "compile_error"},
           "a child that spins before READY never compiled: compile_error, not timeout (which was worth the "
           "compile reward)", item=6),
    Attack("closure_guard.py", {"all": "static_check_failed", "no_static": "correct", "bare": "correct"},
           "no kernel ever runs: `operator.attrgetter('__closure__')` on the launch recorder hands over the Guard, "
           "whose launch record it forges and whose decoy switch it reads. Banned in source (attrgetter, "
           "methodcaller, dunder names as text, getattr as a value, cell_contents); with the static check off "
           "it is `correct` (the in-process layers are evidence: on a GPU its coverage is 0)", item=4),
    Attack("closure_match.py", {"all": "static_check_failed", "no_static": "correct", "bare": "correct"},
           "closure_guard.py with class patterns instead of text (`case object(__closure__=cells)`): banned in "
           "source (a class pattern's keywords are lookups like any `.name`); without the static check, as "
           "closure_guard.py", item=4),
    # A pair, run in this order (tests/evaluator/test_corpus.py and bench/gpu_evaluator_corpus.py run it on
    # its own, in sequence): an honest evaluation publishes (input, output) pairs, a later one replays them.
    Attack("replay_publish.py", {"bare": "correct"},
           "honest, and publishes every (input, output) pair it sees in System V shared memory (see replay.py)"),
    Attack("replay.py", {"bare": "incorrect"},
           "answers from the pairs replay_publish.py left, computing nothing: `correct`, no flag, while children "
           "shared the host's IPC namespace and inputs were a function of (salt, problem). Each child now has its "
           "own IPC namespace and the parent draws the inputs per evaluation: no table, no input seen before",
           item=7),
    Attack("decoy_canary.py", {"all": "correct+output_not_from_kernel"},
           "the decoy trial's documented blind spot: its kernel's canary tells it the kernel was skipped, and it "
           "fails on purpose. The decoy trial still misses it; its answer is PyTorch's, written over the canary "
           "after the kernel, which the values tell (it was `correct`, no flag, on the CPU); on a GPU coverage "
           "(COVERAGE below) is low too", item=4),
    Attack("torch_then_copy.py", {"all": "correct", "bare": "correct"},
           "the gap the values leave: PyTorch computes the answer into a tensor of its own and a copy kernel "
           "writes it into the output, so what a kernel wrote last is what is returned, and the decoy trial sees "
           "the copy needed. `correct`, no flag, on the CPU (correctness only: no speed is rewarded there); on "
           "a GPU the copy's share of the GPU time (coverage) scales its speed reward",
           item=4),
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
# (file, problem, backend, coverage range it must land in, flag it must carry or "").
COVERAGE = [("honest.py", "matmul_relu", "triton", (0.9, 1.0), ""),
            ("lazy.py", "matmul_relu", "triton", (0.0, 0.5), ""),
            ("decoy.py", "matmul_relu", "triton", (0.0, 0.1), "kernel_not_needed"),
            ("prefix_name.py", "matmul_relu", "triton", (0.0, 0.1), "kernel_not_needed"),
            ("skip_profile.py", "matmul_relu", "triton", (0.9, 1.0), ""),
            ("../attacks/decoy_canary.py", "relu", "triton", (0.0, 0.6), "output_not_from_kernel"),
            ("../cuda_relu_correct.py", "relu", "cuda", (0.5, 1.0), "")]


REPLAY_KEY = 0x6B667270  # the System V key replay_publish.py and replay.py share (their KEY)


def replay_table_id() -> int:
    """The id of the segment replay_publish.py made in this (the host's) IPC namespace, or -1."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).shmget(REPLAY_KEY, 0, 0)


def remove_replay_table() -> None:
    """The segment replay_publish.py makes outlives its child where children share the host's IPC namespace."""
    import ctypes

    shmid = replay_table_id()
    if shmid >= 0:
        ctypes.CDLL(None, use_errno=True).shmctl(shmid, 0, None)  # IPC_RMID
