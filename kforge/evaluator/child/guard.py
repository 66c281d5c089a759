"""In-child defences, installed before the candidate is imported: an audit hook and a launch recorder.

Both live in the candidate's own process, so a candidate that runs native code (a CUDA extension)
can defeat them: they raise the cost of tampering and produce evidence (flags), never a verdict on
their own. The parent's checks (its own trials, comparison, clock and output samples) decide.

- The PEP 578 audit hook cannot be removed once added. It refuses, when the candidate's code asks
  for them directly (or through the standard library), frame and garbage-collector inspection,
  ctypes, file access, processes, sockets, signals, and rewriting the special attributes of library
  functions and classes (`__code__`, `__defaults__`...). Code made at run time counts as the
  candidate's (a frame of `<string>` or any other file that is not a file). New code and unpickling
  (`exec`, `compile`, code and function objects, `marshal`, `pickle.find_class`) are refused whenever
  any frame of the candidate's is on the stack, whoever asks: numpy.load or torch.load would otherwise
  unpickle for it. Only Python's import of installed modules, dataclasses and Triton (which make
  functions from generated text that no candidate controls) may make code then.
  CPython raises no audit event for a plain class-attribute assignment (`JITFunction.run = f`):
  the static check refuses it in source, and the harness's identity check reports it afterwards.
- Nor for a store on a module (`t = torch; t.frombuffer = f`): the modules of the protected packages loaded
  before the candidate are frozen (`freeze_modules`): with a frame of the candidate's on the stack, an
  attribute they hold can be neither replaced nor deleted (a new one can be added: importing a submodule
  does that).
- The launch recorder wraps Triton's `JITFunction.run` (and the interpreter's) and load_inline
  extension functions, and records a launch once it returned (one that failed to compile never
  launched). A launch counts as the candidate's kernel only when the function was defined in the
  candidate's file; the harness then checks that it touched the trial's tensors. In a trial each such
  launch also leaves a sample of what it wrote (`Guard.written`, written.py). In the decoy trial
  (`Guard.ablate`) the candidate's Triton launches are skipped.
"""

from __future__ import annotations

import re
import sys
import types
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from kforge.evaluator.protocol import CODE_EVENTS, DENIED_EVENTS  # the events refused (shared with the judge)

if TYPE_CHECKING:
    import torch

    from kforge.evaluator.child.written import Written

# Modules whose classes a candidate may not patch (the rest of `object.__setattr__` is its own business).
_PROTECTED = ("torch", "triton", "kforge", "builtins", "numpy", "time", "os", "sys", "types", "functools")


@dataclass
class Launch:
    candidate: bool  # the launched function was defined in the candidate's file
    name: str = ""  # the kernel's function name (Triton names the GPU kernel after it)
    ranges: list[tuple[int, int]] = field(default_factory=list)  # (start, end) of each tensor argument's storage


@dataclass
class Guard:
    """What the hook refused and which kernels ran; read by the harness, reported as evidence."""

    candidate_file: str
    denied: list[str] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    # During a trial the launched kernels' tensors are kept alive until the trial's evidence is taken:
    # otherwise the allocator hands their memory to the output and an unrelated launch looks "on data".
    held: list[torch.Tensor] | None = None
    patched: dict[str, tuple[type, str, Callable[..., object]]] = field(default_factory=dict)
    ablate: bool = False  # skip the candidate's own Triton launches (the parent's decoy trial)
    written: Written | None = None  # in a trial: what each launch of the candidate's left in its storage
    cuda_kernels: set[str] = field(default_factory=set)  # __global__ names of its load_inline sources
    cuda_namespaces: set[str] = field(default_factory=set)


def _stdlib_dirs() -> tuple[str, ...]:
    """The standard library's folders, as prefixes with a trailing separator. In a virtual environment
    `platstdlib` is the venv's lib folder, which holds site-packages: it must not count."""
    import os
    import sysconfig

    paths = {sysconfig.get_paths(vars={"base": sys.base_prefix, "platbase": sys.base_prefix}).get(k, "")
             for k in ("stdlib", "platstdlib")}
    return tuple(os.path.join(p, "") for p in paths if p and "site-packages" not in p)


def _triton_dir() -> str:
    """Triton's package folder with a trailing separator ('' without Triton)."""
    import os

    try:
        import triton
    except ImportError:
        return ""
    return os.path.join(os.path.dirname(os.path.abspath(triton.__file__)), "")


_FD_PATH = re.compile(r"^/+(proc/+[^/]+/+(task/+\d+/+)?fd|dev/+fd|dev/+std(in|out|err))(/|$)")


def fd_path(path: object) -> bool:
    """/proc/self/fd/N, /proc/<pid>/fd/N, /proc/thread-self/fd/N or /dev/fd/N (and /dev/stdout...)."""
    text = path.decode(errors="replace") if isinstance(path, bytes) else str(path)
    return bool(_FD_PATH.match(text))


_CODE_MAKERS = ("dataclasses.py", "ast.py")  # stdlib files whose generated code is built from identifiers


def candidate_like(filename: str, cand: str) -> bool:
    """The candidate's file, or code made at run time (`<string>`, `<timeit-src>`...): not a file at all."""
    return filename == cand or (filename.startswith("<") and not filename.startswith("<frozen"))


def asker_is_candidate(frame: types.FrameType | None, cand: str, stdlib: tuple[str, ...], triton_dir: str) -> bool:
    """Is the candidate the one asking? The first frame outside the standard library decides (so
    `inspect.currentframe()` counts as the candidate's, while Triton's own compile does not).

    Code made at run time counts as the candidate's, except Triton's generated argument binder (the
    `<string>` function `dynamic_func`, made from the kernel's parameter names, called by Triton's
    launcher in runtime/jit.py): its native specialisation opens files on a GPU's first launch, under
    the candidate's launch. Nothing else that may make code at run time names a function so."""
    while frame is not None:
        name = frame.f_code.co_filename
        if candidate_like(name, cand):
            caller = frame.f_back
            binder = (triton_dir and name == "<string>" and frame.f_code.co_name == "dynamic_func"
                      and caller is not None and caller.f_code.co_filename == triton_dir + "runtime/jit.py")
            return not binder
        library = name.startswith(stdlib) and "-packages/" not in name
        if not (name.startswith("<frozen") or library):
            return False
        frame = frame.f_back
    return False


def may_make_code(event: str, args: tuple[Any, ...], caller: str, libraries: tuple[str, ...], triton_dir: str,
                  stdlib: tuple[str, ...], asker: str = "") -> bool:
    """With a frame of the candidate's on the stack: may `caller` (the frame that raised `event`) make code?
    `asker` is the first frame outside the standard library, counting from the event.

    No kernel unpickles. Importing an installed module compiles or unmarshals its own file; Triton and
    dataclasses compile text they generate from identifiers; ast.parse compiles to a tree only. Triton's
    compiler also makes code through the standard library (a namedtuple per kernel signature on a GPU),
    so Triton as the asker counts even when a standard-library frame raised the event."""
    if event == "pickle.find_class":
        return False
    if caller.startswith("<frozen importlib"):
        if event.startswith("marshal."):
            return True
        source = getattr(args[0], "co_filename", None) if event == "exec" and args else (
            args[1] if event == "compile" and len(args) > 1 else None)
        return isinstance(source, str) and source.startswith(libraries)
    if triton_dir and (caller.startswith(triton_dir) or asker.startswith(triton_dir)) and event in ("exec", "compile"):
        return True
    return caller.startswith(stdlib) and caller.endswith(_CODE_MAKERS) and event in ("exec", "compile")


def import_read(frame: types.FrameType | None, args: tuple[object, ...], libraries: tuple[str, ...]) -> bool:
    """Python's import reading a module file of an installed library: an import the hook lets through (of
    torch, Triton, numpy: `from triton.language.extra import libdevice`) loads modules the child has not
    loaded yet, and the loader's read of their files must not count as the candidate's `open`."""
    import os

    if frame is None or frame.f_code.co_filename != "<frozen importlib._bootstrap_external>":
        return False
    path, mode = args[0], str(args[1]) if len(args) > 1 else "r"
    return (isinstance(path, str) and not set(mode) & set("wax+")
            and os.path.abspath(path).startswith(libraries) and path.endswith((".py", ".pyc", ".so")))


def _library_dirs() -> tuple[str, ...]:
    """Folders whose files are installed code: the standard library and every sys.path folder except the
    working folder (Landlock keeps the child from writing any of them)."""
    import os

    dirs = {os.path.join(os.path.abspath(p), "") for p in sys.path if p and os.path.isabs(p) and os.path.isdir(p)}
    dirs |= set(_stdlib_dirs())
    here = os.path.join(os.getcwd(), "")
    return tuple(d for d in dirs if d != here)


def install_audit_hook(guard: Guard) -> None:
    """Add the hook (irreversible). Everything it needs is bound here, none of it in module globals."""

    cand = guard.candidate_file
    stdlib = _stdlib_dirs()
    libraries = _library_dirs()
    triton_dir = _triton_dir()
    getframe = sys._getframe
    busy = [False]
    denied = guard.denied
    protected = _PROTECTED
    events = DENIED_EVENTS | CODE_EVENTS
    code_events = CODE_EVENTS
    module_type = types.ModuleType
    like = candidate_like
    may = may_make_code
    asker = asker_is_candidate

    def code_refused(event: str, args: tuple[Any, ...]) -> bool:
        frame = getframe(2)
        caller = frame.f_code.co_filename if frame is not None else ""
        asker = ""
        while frame is not None:
            name = frame.f_code.co_filename
            if like(name, cand):
                return not may(event, args, caller, libraries, triton_dir, stdlib, asker)
            if not asker and not (name.startswith(stdlib) and "-packages/" not in name):
                asker = name
            frame = frame.f_back
        return False

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if busy[0] or event not in events:
            return
        busy[0] = True
        try:
            if event in code_events:
                if not code_refused(event, args):
                    return
            else:
                if event == "open" and args and fd_path(args[0]):
                    # Its own pipes to the parent, reopened by path through any library (numpy.savetxt...):
                    # nobody in the child has a reason to, whoever asks.
                    denied.append("open:fd")
                    raise PermissionError("kforge sandbox: opening a file descriptor by path is not allowed")
                if event in ("object.__setattr__", "object.__delattr__"):
                    # A module (its `__class__` swapped back to thaw it) by its own name, a class by its module's.
                    target = args[0] if args else None
                    owner = target.__name__ if isinstance(target, module_type) else getattr(target, "__module__", "")
                    # By package: the candidate's own module (`kforge_candidate`) is not kforge's.
                    if not isinstance(owner, str) or owner.split(".")[0] not in protected:
                        return
                if event == "import" and args and str(args[0]).split(".")[0] in ("torch", "triton", "math", "numpy"):
                    return
                if event == "open" and args and import_read(getframe(1), args, libraries):
                    return
                if not asker(getframe(1), cand, stdlib, triton_dir):  # frame 0 is the hook
                    return
            denied.append(event)
        finally:
            busy[0] = False
        raise PermissionError(f"kforge sandbox: `{event}` is not allowed in a candidate kernel")

    sys.addaudithook(hook)


def kernel_global(name: str) -> bool:
    """A module a Triton kernel may name in its body (`triton`, `tl`, libdevice, Gluon's): Triton's GPU compile
    takes a module global only when its type `is ModuleType`. The harness reads none of them after the import."""
    return name.startswith(("triton.language", "triton.experimental")) or name.partition(".") == ("triton", "", "")


def freeze_modules(guard: Guard) -> int:
    """Give every plain module of the protected packages loaded so far a class whose `__setattr__` and
    `__delattr__` refuse to replace or delete an attribute it holds when the candidate asks (directly or
    through the standard library: `asker_is_candidate`); a library's own patching (Triton's interpreter swaps
    `triton.language` functions around each launch) goes on. Reading is untouched. Returns how many modules
    were frozen."""
    cand, stdlib, triton_dir = guard.candidate_file, _stdlib_dirs(), _triton_dir()
    getframe, asker, denied = sys._getframe, asker_is_candidate, guard.denied
    plain, own_dict = types.ModuleType, object.__getattribute__
    set_attr, del_attr = types.ModuleType.__setattr__, types.ModuleType.__delattr__

    def refuse(module: types.ModuleType, name: str, event: str) -> None:
        if asker(getframe(2), cand, stdlib, triton_dir):  # frame 0 is this, 1 the module's __setattr__
            denied.append(event)
            raise PermissionError(f"kforge sandbox: changing `{own_dict(module, '__name__')}.{name}` is not "
                                  "allowed in a candidate kernel")

    class Frozen(types.ModuleType):
        def __setattr__(self, name: str, value: object) -> None:
            held = own_dict(self, "__dict__")
            if (name in held and held[name] is not value) or name == "__class__":  # `__class__`: a thaw
                refuse(self, name, "module.__setattr__")
            set_attr(self, name, value)

        def __delattr__(self, name: str) -> None:
            if name in own_dict(self, "__dict__"):
                refuse(self, name, "module.__delattr__")
            del_attr(self, name)

        def __deepcopy__(self, memo: dict[int, object]) -> Frozen:  # Triton's JIT copies a kernel's globals
            return self

    count = 0
    for name, module in list(sys.modules.items()):
        # Not `sys`: importlib makes every new module as `type(sys)(name)`, and sets its `__loader__` over the
        # None there; frozen, every import of a module not loaded yet would be refused.
        if type(module) is plain and name.split(".")[0] in _PROTECTED and name != "sys" and not kernel_global(name):
            module.__class__ = Frozen
            count += 1
    return count


def _storage_ranges(args: Sequence[object], kwargs: Mapping[str, object]) -> list[tuple[int, int]]:
    from kforge.evaluator.child.written import storage_ranges

    return storage_ranges([*args, *kwargs.values()])


def _hold(guard: Guard, args: Sequence[object], kwargs: Mapping[str, object]) -> None:
    import torch

    if guard.held is not None:
        guard.held += [a for a in list(args) + list(kwargs.values()) if isinstance(a, torch.Tensor)]


def install_launch_recorder(guard: Guard, interpreter: bool) -> None:
    """Record every Triton launch: whether the kernel is the candidate's and which storage it touched."""
    classes = []
    try:
        from triton.runtime.jit import JITFunction

        classes.append(JITFunction)
    except ImportError:
        pass
    if interpreter:
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
    cand = guard.candidate_file
    launches = guard.launches
    for cls in classes:
        orig = cls.run

        def run(self: object, *args: object, __orig: Callable[..., object] = orig, **kwargs: object) -> object:
            if kwargs.get("warmup", False):
                return __orig(self, *args, **kwargs)
            fn = getattr(self, "fn", None)
            code = getattr(fn, "__code__", None)
            own = getattr(code, "co_filename", "") == cand
            if own and guard.ablate:
                return None  # the decoy trial: does the answer still come out right without it?
            # Recorded once it returned: a kernel that failed to compile (Triton compiles at the first launch)
            # did not launch, and a call that caught the failure must not show it did.
            ranges = _storage_ranges(args, kwargs)
            if own and guard.written is not None:
                guard.written.before_launch(list(args) + list(kwargs.values()))
            result = __orig(self, *args, **kwargs)
            launches.append(Launch(own, getattr(fn, "__name__", ""), ranges))
            _hold(guard, args, kwargs)
            if own and guard.written is not None:
                guard.written.after_launch(list(args) + list(kwargs.values()))
            return result

        cls.run = run
        guard.patched[f"{cls.__module__}.{cls.__name__}.run"] = (cls, "run", run)


def recording_module(mod: types.ModuleType, guard: Guard) -> types.ModuleType:
    """Wrap a load_inline extension: each call of its functions is a launch of the candidate's code."""
    proxy = types.ModuleType(mod.__name__)
    launches = guard.launches
    for name in dir(mod):
        attr = getattr(mod, name)
        if callable(attr) and not name.startswith("_"):
            def call(*a: object, __f: Callable[..., object] = attr, **k: object) -> object:
                ranges = _storage_ranges(a, k)
                if guard.written is not None:
                    guard.written.before_launch(list(a) + list(k.values()))
                out = __f(*a, **k)
                # What it returns is what it wrote (an extension allocates its outputs itself).
                outs = list(out) if isinstance(out, (list, tuple)) else [out]
                launches.append(Launch(True, "", ranges + _storage_ranges(outs, {})))  # once it returned
                _hold(guard, list(a) + outs, k)
                if guard.written is not None:
                    guard.written.after_launch(list(a) + list(k.values()) + outs)
                return out

            setattr(proxy, name, call)
        else:
            setattr(proxy, name, attr)
    return proxy


# An output this many times smaller than the call's inputs that no kernel of the candidate's wrote is a result
# PyTorch finished (a loss's sum divided by its count), not work PyTorch did instead of the kernels: it is
# counted apart, and the parent asks the profiled call's GPU time who did the work (judge.EPILOGUE_MIN_SHARE).
EPILOGUE_RATIO = 64


def summarize(launches: list[Launch], trial_ranges: list[tuple[int, int]],
              out_ranges: list[tuple[int, int]] | None = None) -> dict[str, int]:
    """Launch evidence for one call: the candidate's kernels that touched the call's tensors, the rest, and
    how many outputs no kernel of the candidate's was handed (or returned): PyTorch made those, whatever
    kernel ran before (a copy kernel, then `nn.Softmax(dim=-1)(y)`). Small ones (EPILOGUE_RATIO) apart."""
    def touches(launch: Launch, ranges: list[tuple[int, int]]) -> bool:
        return any(a < e and s < b for a, b in launch.ranges for s, e in ranges)

    outs = out_ranges or []
    in_bytes = sum(e - s for s, e in trial_ranges if (s, e) not in outs)
    own = [launch for launch in launches if launch.candidate]
    on_data = sum(1 for launch in own if touches(launch, trial_ranges))
    unwritten = [r for r in outs if not any(touches(launch, [r]) for launch in own)]
    small = sum(1 for s, e in unwritten if (e - s) * EPILOGUE_RATIO <= in_bytes)
    return {"kernels": len(own), "kernels_on_data": on_data, "foreign": len(launches) - len(own),
            "outputs_unwritten": len(unwritten) - small, "outputs_finished": small}
