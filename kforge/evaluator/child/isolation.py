"""The harness's own torch calls kept apart from the candidate's torch state, in the candidate's process.

The harness samples what the kernels wrote (written.py), copies the outputs into the arena (arena_writer.py)
and takes its evidence with torch calls of its own, after the candidate's code has run. Three things the
candidate can leave behind would reach into those calls and choose what the parent reads:
- a torch-function or dispatch mode kept entered (a suspended generator's `with`, at import or in forward);
- the thread's dispatch keys switched on or off (`enable_python_dispatcher`, under which `py_impl` kernels run);
- a kernel registered with the dispatcher for an op the harness uses (`torch.library`, by any path).
`modes()` and `DispatchSeal` are taken before any candidate code runs and compared after each call (the
request loop's `check_harness`) and at each sample of a launch; `harness_only()` switches modes and the
Python dispatcher off around the harness's own calls. Everything here is bound at import.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

_fn_len, _fn_at = torch._C._len_torch_function_stack, torch._C._get_function_stack_at
_dispatch_len, _dispatch_at = torch._C._len_torch_dispatch_stack, torch._C._get_dispatch_stack_at
_tls_included, _tls_excluded = torch._C._dispatch_tls_local_include_set, torch._C._dispatch_tls_local_exclude_set
_dump_table = torch._C._dispatch_dump_table
_no_fn_modes, _no_dispatch_modes = torch._C.DisableTorchFunction, torch._C._DisableTorchDispatch
_no_python_dispatcher = torch._C._DisablePythonDispatcher

MODE_LEFT = "kforge sandbox: a torch function or dispatch mode the candidate entered is still entered after forward"
SEAL_BROKEN = "kforge sandbox: a kernel was registered for a PyTorch operator the harness uses"

# The ops the harness's own samples and copies go through (written.py, the copy into the arena, the request
# loop's checks), as a dispatch log of them shows.
HARNESS_OPS = ("aten::copy_", "aten::clone", "aten::index_select", "aten::equal", "aten::empty.memory_format",
               "aten::set_.source_Storage", "aten::view", "aten::view.dtype", "aten::detach", "aten::alias",
               "aten::as_strided", "aten::t", "aten::arange", "aten::arange.start", "aten::cat",
               "aten::randint.low_generator", "aten::_to_copy", "aten::lift_fresh", "aten::_copy_from",
               "aten::_copy_from_and_resize")


def modes() -> tuple[object, ...]:
    """The torch-function and dispatch modes entered in this thread, by identity, and the thread's dispatch
    keys switched on and off (the Python dispatcher is one: `enable_python_dispatcher` adds it)."""
    return (*(id(_fn_at(i)) for i in range(_fn_len())), -1, *(id(_dispatch_at(i)) for i in range(_dispatch_len())),
            repr(_tls_included()), repr(_tls_excluded()))


class DispatchSeal:
    """The dispatcher's C++ kernels for HARNESS_OPS as they were before the candidate's code ran (`torch.library`
    registrations land there). A kernel registered for one of them later would run inside the harness's own
    copies: in the copy into the arena it chose what the parent reads. Python kernels (`py_impl`) run only
    under the Python dispatcher, which the harness's own calls switch off (`harness_only`): torch adds some of
    those lazily, so sealing them would refuse honest work."""

    def __init__(self) -> None:
        self.tables = {op: _dump_table(op) for op in HARNESS_OPS}

    def intact(self) -> bool:
        return all(_dump_table(op) == table for op, table in self.tables.items())


@contextlib.contextmanager
def harness_only() -> Iterator[None]:
    """The harness's own torch calls (samples, the copy into the arena, the evidence) with every
    torch-function and dispatch mode and the Python dispatcher switched off: a mode the candidate entered (at
    import, in forward, or from a callback on the way) sees none of them."""
    with _no_fn_modes(), _no_dispatch_modes(), _no_python_dispatcher():
        yield
