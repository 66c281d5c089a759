"""The kernel backends (``dataset.backend``): one record each, the one place a backend's rules are written.

Everything that differs between Triton and CUDA candidates is a field here, read by the parts that act on
it: the prompt (``policy.prompts``), the static check and the format reward's structure rule
(``evaluator.static_check``, ``credit.structure``), the pool's build step and the examination's lock-down
and decoy trial (``evaluator.pool``, ``evaluator.examine``), the doctor's checks (``ops``) and the example
corpus (``rag``). Adding a backend is one record here, its name in ``DatasetConfig.backend``'s literal
(``tests/house/test_choice_tables.py`` checks that the two agree) and whatever new kind of build or structure it needs.

Parent-side only: the sandboxed child never imports this module (the parent tells it what to do in its job).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

_COMPUTE_RULE = (
    "The {label} kernels must do the actual computation. PyTorch may allocate outputs and reshape or view "
    "tensors, but must not compute the result (no torch.matmul, F.softmax, torch.sum and the like on the "
    "main path, no try/except fallback to PyTorch, no calling or subclassing `Model`)."
)
# The pseudo-kernel name the static check records for a `load_inline(...)` extension.
EXTENSION_KERNEL = "load_inline"


@dataclass(frozen=True)
class KernelBackend:
    name: str
    label: str  # the name in a sentence
    # -- the prompt
    how: str  # the system prompt's rule: how to write the kernels
    must: str  # the system prompt's rule: what the kernels must do
    compact_how: str  # the compact prompt's words for the kernels
    skeleton: str  # the compact prompt's answer skeleton
    # -- the structure rule (static check, format reward)
    kernel: Literal["jit", "extension"]  # the module's kernel: a decorated function launched `kernel[grid](...)`,
    # or a name bound to `load_inline(...)` whose functions are called `ext.fn(...)`
    missing_kernel: str  # the static check's error for a module without one
    # -- the build step and the examination
    built: bool  # compiled by a build child of its own (CPU work, cached) before the candidate is examined
    compiles_at_first_launch: bool  # on a GPU the child locks down after its first trial, not at READY
    decoy: bool  # the trials include a decoy: the same problem without the candidate's kernels
    needs_gpu: bool  # nothing runs it on a CPU: refused by a CPU pool, a GPU-only setting for the doctor
    toolchain: Literal["triton_probe", "nvcc"]  # what `kforge doctor` requires for it: the triton package and a
    # kernel probe | nvcc, ninja and a C++ compiler
    # -- the example corpus (rag)
    hub_corpus: str  # the hub corpus `kforge rag build` adds by default
    corpus_column: str  # the hub corpus's kernel column, which says the backend of its rows
    markers: tuple[str, ...]  # text that shows kernel code is this backend's (a row without a backend)
    lexer: str  # how `kforge rag query` highlights its code

    def has_kernel(self, kernels: list[str] | set[str]) -> bool:
        """Whether the static check's kernels (names, EXTENSION_KERNEL for an extension) hold this backend's."""
        if self.kernel == "extension":
            return EXTENSION_KERNEL in kernels
        return any(k != EXTENSION_KERNEL for k in kernels)


TRITON = KernelBackend(
    name="triton",
    label="Triton",
    how="Write the kernels in Triton (`import triton`, `import triton.language as tl`) as `@triton.jit` "
        "functions, launched from `ModelNew.forward`.",
    must=_COMPUTE_RULE.format(label="Triton"),
    compact_how="Triton kernels (`@triton.jit`)",
    skeleton="import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n"
             "@triton.jit\ndef kernel(...):\n    ...\n\nclass ModelNew(nn.Module):\n    ...",
    kernel="jit",
    missing_kernel="no @triton.jit kernel found: a pure-PyTorch ModelNew earns nothing",
    built=False,
    compiles_at_first_launch=True,  # ptxas runs at each kernel's first launch: no exec before that is over
    decoy=True,
    needs_gpu=False,  # the Triton interpreter (TRITON_INTERPRET=1)
    toolchain="triton_probe",
    hub_corpus="kernelbook",
    corpus_column="triton_code",
    markers=("triton",),
    lexer="python",
)

CUDA = KernelBackend(
    name="cuda",
    label="CUDA",
    how="Write the kernels in CUDA C++ and compile them inline with "
        "`torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])`: "
        "`cuda_sources` holds the `__global__` kernels and a host function that launches them and returns "
        "torch::Tensor results, `cpp_sources` declares that host function. Call it from `ModelNew.forward`.",
    must=_COMPUTE_RULE.format(label="CUDA"),
    compact_how="CUDA kernels compiled with `load_inline`",
    skeleton="import torch\nimport torch.nn as nn\nfrom torch.utils.cpp_extension import load_inline\n\n"
             "ext = load_inline(...)\n\nclass ModelNew(nn.Module):\n    ...",
    kernel="extension",
    missing_kernel="no CUDA extension (torch.utils.cpp_extension.load_inline) found",
    built=True,
    compiles_at_first_launch=False,  # built before the child starts
    decoy=False,
    needs_gpu=True,
    toolchain="nvcc",
    hub_corpus="sakana",
    corpus_column="CUDA_Code",
    markers=("load_inline", "__global__", "#include"),
    lexer="cpp",
)

KERNEL_BACKENDS: dict[str, KernelBackend] = {b.name: b for b in (TRITON, CUDA)}
# The backend the built-in suite's reference solutions are written for (its worked examples and corpus rows).
SOLUTIONS_BACKEND = TRITON.name


def names() -> str:
    """The backends' names for a message: "triton, cuda"."""
    return ", ".join(KERNEL_BACKENDS)


def cpu_backends() -> str:
    """The backends a machine without a GPU runs, for a message: "triton"."""
    return " or ".join(b.name for b in KERNEL_BACKENDS.values() if not b.needs_gpu)


def guess_backend(kernel_code: str) -> str | None:
    """The backend whose markers the kernel code shows; None when it shows none. A backend with a build step
    is tried first: its source is a Python module too, and may mention the others' names."""
    for backend in sorted(KERNEL_BACKENDS.values(), key=lambda b: not b.built):
        if any(marker in kernel_code for marker in backend.markers):
            return backend.name
    return None
