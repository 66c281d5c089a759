"""GPU-time coverage (child side): the share of a profiled call's GPU kernel time spent in the
candidate's own kernels, matched by exact name.

A profiler reports kernels by demangled name: a Triton kernel by its function's name, a CUDA kernel of a
load_inline extension as `name(args)` (or `ns::name(args)`), PyTorch's own as
`void at::native::vectorized_elementwise_kernel<4, ...>(...)`. The qualified name (return type, template
arguments and parameters stripped) must equal one of the candidate's kernel names, or that name inside
a namespace its own source opened: a kernel called `v` or `vectorized_elementwise_kernel` claims nothing
of PyTorch's.

Evidence from the candidate's process: it scales speed reward, never grants it.
"""

from __future__ import annotations

import re
from typing import Any, Iterable

_GLOBAL = re.compile(r"__global__\s+[^;{(]*?(\w+)\s*\(")
_NAMESPACE = re.compile(r"\bnamespace\s+(\w+)\s*\{")
_ANON_SOURCE = re.compile(r"\bnamespace\s*\{")
ANON = "(anonymous namespace)"  # how a demangled name spells a namespace without a name
_RESERVED = frozenset({"at", "c10", "cub", "thrust", "cutlass", "std", "native", "torch", "cuda", "cudnn",
                       "cublas", "triton", "detail", "internal"})


def cuda_kernel_names(source: str) -> tuple[set[str], set[str]]:
    """(`__global__` function names, namespaces the source opens) of a CUDA source text."""
    text = re.sub(r"//[^\n]*|/\*.*?\*/", " ", source, flags=re.S)
    text = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", text)
    spaces = set(_NAMESPACE.findall(text)) - _RESERVED
    if _ANON_SOURCE.search(text):  # `namespace { __global__ void k(...) }`: profiled as `(anonymous namespace)::k`
        spaces.add(ANON)
    return set(_GLOBAL.findall(text)), spaces


def qualified_name(profiled: str) -> str:
    """`void ns::k<4, float>(float const*, int)` -> `ns::k`; `relu_kernel` -> `relu_kernel`;
    `void (anonymous namespace)::k<float>(float*)` -> `(anonymous namespace)::k`."""
    name = profiled.strip().replace(ANON, "\0")  # its parentheses are part of the name, not the parameters
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the first '(' or '<' outside any bracket ends the name
        if ch in "<(" and depth == 0:
            cut = i
            break
    name = name[:cut].strip()
    return name.rsplit(" ", 1)[-1].replace("\0", ANON)  # drop a return type


def is_own(profiled: str, names: set[str], namespaces: set[str] = frozenset()) -> bool:
    q = qualified_name(profiled)
    if q in names:
        return True
    head, _, leaf = q.rpartition("::")
    if not head or leaf not in names:
        return False
    # Every enclosing namespace is one the candidate's source opened; a nameless one inside its own
    # counts too. A nameless one on the outside counts only when its source opened one: PyTorch's
    # `at::native::(anonymous namespace)::k` stays PyTorch's.
    parts = head.split("::")
    return all(p in namespaces or (p == ANON and i > 0) for i, p in enumerate(parts))


def kernel_coverage(kernel_us: dict[str, float], names: set[str], namespaces: set[str] = frozenset()) -> float:
    """Share of GPU kernel time spent in the candidate's own kernels; no GPU time at all is 0.0 (a
    profiled call that launched nothing did none of the work)."""
    total = sum(kernel_us.values())
    if total <= 0:
        return 0.0
    return sum(us for name, us in kernel_us.items() if is_own(name, names, namespaces)) / total


def kernel_times(events: Iterable[Any]) -> dict[str, float]:
    """GPU microseconds per kernel name from torch.profiler's `key_averages()` (CUDA activity only, so
    every event is device work): `device_time_total`, or `cuda_time_total` on older torch."""
    kernel_us: dict[str, float] = {}
    for ev in events:
        us = float(getattr(ev, "device_time_total", 0.0) or getattr(ev, "cuda_time_total", 0.0) or 0.0)
        if us > 0 and ev.key:
            kernel_us[ev.key] = kernel_us.get(ev.key, 0.0) + us
    return kernel_us
