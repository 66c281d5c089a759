"""The parent <-> child protocol: request and answer names, and the problem text a candidate child is given.

Order (the parent drives, one request at a time, and accepts only the answer it asked for):

    child  -> READY     {durations, evidence}                      (after import and model build)
    parent -> trial     {id, seed, signed, slots, ablate}   child -> TRIAL {id, meta, plain, evidence}
    parent -> warmup    {seeds}                             child -> WARM                 (fresh inputs)
    parent -> time      {seed, slots, profile}              child -> WINDOW {}            (its window ended)
                                                            child -> TIMED {ms, plain, evidence, coverage}
    parent -> profile   {seed}                              child -> PROFILE {coverage}   (GPU, flagged only)
    parent -> bye

Outputs never travel in a message. Before it answers a `trial` or a `time` request the child copies
every output tensor whole into its slot of the output arena (shared memory the parent made, see
arena.py); the parent then freezes the child, reads what it wants there itself, and thaws it. Positions
the parent compares are never sent, so nothing in the child can compute just those. Plain (non-tensor)
outputs travel in the answer.

Any other message, a second answer, or a frame larger than a small message ends the child as
`crashed` with the flag `protocol_violation`.
"""

from __future__ import annotations

import ast

# child -> parent
READY, TRIAL, WARM, TIMED, PROFILE, BUILT, ERROR = ("ready", "trial", "warm", "timed", "profile", "built", "error")
WINDOW = "window"  # a timed call's window ended: the parent's clock splits there (before the copy-out)
# parent -> child
OP_TRIAL, OP_WARMUP, OP_TIME, OP_PROFILE, OP_COMPILE, OP_BYE = ("trial", "warmup", "time", "profile", "compile", "bye")

HEADROOM = 1 << 16  # the smallest bound any answer gets (JSON framing, evidence, plain values)

# What the candidate's child reports as `patched:<name>` (harness._changed): the functions it compares before
# and after the candidate ran, and the Triton launchers the launch recorder wraps (guard.py). The parent
# passes on no other name: evidence is the child's text, and a name that reaches a prompt is one kforge wrote.
WATCHED = ("torch.cuda.synchronize", "torch.cuda.Event", "torch.cuda.Event.record", "torch.cuda.Event.elapsed_time",
           "torch.cuda.Event.synchronize", "torch.cuda.current_stream", "time.perf_counter", "time.time",
           "time.monotonic", "time.perf_counter_ns", "torch.manual_seed", "torch.rand", "torch.randn",
           "torch.rand_like", "torch.randn_like", "torch.Tensor.cpu", "torch.Tensor.to", "torch.Tensor.data_ptr",
           "torch.Tensor.clone", "torch.Tensor.copy_", "torch.nn.Module.__call__", "os._exit", "os.write")
LAUNCHERS = ("triton.runtime.jit.JITFunction.run", "triton.runtime.interpreter.InterpretedFunction.run")
ALL = "all"  # read whole outputs (those small enough to compare whole)

# The audit events the child's guard (child/guard.py) refuses, reported as `denied` evidence; the parent's
# judge passes on no other name. These: refused when the candidate's code is the one asking
# (guard.asker_is_candidate).
DENIED_EVENTS = frozenset({
    "sys._getframe", "sys._current_frames", "sys._current_exceptions", "sys.settrace", "sys.setprofile",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",
    "ctypes.dlopen", "ctypes.dlsym", "ctypes.cdata", "ctypes.addressof", "ctypes.string_at", "ctypes.wstring_at",
    "ctypes.call_function", "ctypes.create_string_buffer", "ctypes.PyObj_FromPtr",
    "open", "os.listdir", "os.scandir", "os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.chmod",
    "os.symlink", "os.link", "os.truncate", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
    "os.forkpty", "os.kill", "os.killpg", "subprocess.Popen", "socket.__new__", "socket.connect", "socket.bind",
    "shutil.copyfile", "shutil.rmtree", "shutil.move", "mmap.__new__", "builtins.input", "import",
    "object.__setattr__", "object.__delattr__",
})

# Events that make or load code. Refused whenever the candidate's code is anywhere on the stack, unless
# the frame that asked is one of the few makers of code from text no candidate controls (guard._CODE_MAKERS).
CODE_EVENTS = frozenset({"exec", "compile", "code.__new__", "function.__new__", "marshal.loads", "marshal.load",
                         "pickle.find_class"})
# Not audit events: the child's frozen modules (guard.freeze_modules) refuse these with the candidate on the stack.
MODULE_EVENTS = frozenset({"module.__setattr__", "module.__delattr__"})


def inputs_only(problem_code: str) -> str:
    """The problem module without its Model class: what a candidate child needs to build inputs.

    The reference implementation never enters the candidate's process, so it cannot be re-executed
    from there (the candidate can still copy it from its prompt: the static checks and launch
    evidence deal with that)."""
    from kforge.evaluator.static.static_check import parse

    tree = parse(problem_code)
    tree.body = [n for n in tree.body if not (isinstance(n, ast.ClassDef) and n.name == "Model")]
    return ast.unparse(tree) + "\n"
