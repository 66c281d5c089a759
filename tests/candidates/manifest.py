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
    Case("subclass_reference.py", "relu", "runtime_error", ("subclasses_reference_model",)),
    Case("calls_reference.py", "relu", "runtime_error", ("calls_reference_model",)),
    Case("returns_zeros.py", "relu", "incorrect"),
    Case("copy_kernel.py", "relu", "incorrect", ("returns_input",), notes="caught by the signed-input trial"),
    Case("memoise.py", "relu", "incorrect", ("identical_outputs_across_trials",)),
    Case("memoise_after_warmup.py", "relu", "correct", ("inconsistent_after_repeat",)),
    Case("alias_output.py", "relu", "correct", ("output_aliases_input",)),
    Case("monkeypatch_timer.py", "relu", "correct", ("patched:time.perf_counter", "patched:torch.cuda.synchronize")),
    Case("wrong_shape.py", "relu", "incorrect"),
    Case("nan_output.py", "relu", "incorrect"),
    Case("read_other_memory.py", "relu", "correct", correct=True, notes="finds nothing to read: private /proc, no ptrace"),
    Case("env_secret.py", "relu", "runtime_error", notes="raises 'no secret visible' when the env is clean"),
    Case("write_outside.py", "relu", "runtime_error"),
    Case("network.py", "relu", "runtime_error"),
    Case("segfault.py", "relu", "crashed"),
    Case("hang.py", "relu", "timeout"),
    Case("detached_child.py", "relu", "correct", correct=True, notes="its detached process must be gone afterwards"),
    Case("huge_alloc.py", "relu", "runtime_error"),
    Case("illegal_access.py", "relu", "runtime_error|crashed", gpu_only=True, notes="illegal address: sticky CUDA error, fresh process next"),
    Case("side_stream.py", "relu", "correct", correct=True, gpu_only=True, notes="side-stream work is inside the timed window"),
    Case("cuda_relu_correct.py", "relu", "correct", correct=True, gpu_only=True, backend="cuda"),
    Case("cuda_relu_correct.py", "relu", "unsupported", cpu_only=True, backend="cuda"),
    Case("cuda_illegal_access.py", "relu", "runtime_error|crashed", gpu_only=True, backend="cuda"),
    Case("cuda_pure_pytorch.py", "relu", "correct", ("no_kernel_launched",), gpu_only=True, backend="cuda"),
]
