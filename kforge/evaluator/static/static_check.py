"""Static checks on a candidate's source, before anything runs.

Two kinds of finding:
- `errors`: the candidate cannot be a valid answer (syntax error, no ModelNew, no real `@triton.jit` kernel)
  or uses what no kernel needs and every harness attack does: imports outside torch/triton/math and a few
  pure helpers; `sys`, `os`, `gc`, `inspect`, `ctypes`, `importlib`, `builtins` by any path;
  `exec`/`eval`/`compile`/`open`/`globals`/`vars`; dynamic `getattr`/`setattr`; dunder attributes; private
  attributes of torch or Triton; assigning to attributes of torch, Triton or time; native builds but a CUDA
  extension's load_inline (native_source.NATIVE_BUILDS). They end evaluation with Status.STATIC_CHECK_FAILED.
- `flags`: reward-hacking patterns (calling the PyTorch op the problem is about, a try/except fallback to
  PyTorch, using the reference Model). The candidate still runs (its feedback is more useful that way) but a
  flagged verdict is never `correct`.

Source checks are a first filter, not a wall: Python has more paths than any list. The parent's own trials,
clock and output samples are what a verdict rests on."""

from __future__ import annotations

import ast
import re
import threading
from dataclasses import dataclass, field

from kforge.evaluator.static.aliases import import_aliases
from kforge.evaluator.static.hidden_lookup import hidden_lookups
from kforge.evaluator.static.native_source import NATIVE_BUILDS, compiler_text, native_builds_allowed
from kforge.evaluator.static.op_names import op_key, same_op
from kforge.kernel_backends import EXTENSION_KERNEL, KERNEL_BACKENDS

# CPython 3.11's parser keeps recursion bookkeeping that concurrent parses from several threads can
# corrupt ("AST constructor recursion depth mismatch"); the pool parses from its worker threads.
_PARSE_LOCK = threading.Lock()


def parse(code: str) -> ast.Module:
    with _PARSE_LOCK:
        return ast.parse(code)

# Tensor plumbing that any kernel wrapper needs; calling these is never "doing the op in PyTorch".
GLUE_OPS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "new_empty", "new_zeros", "new_ones", "new_full", "arange", "tensor", "as_tensor", "from_numpy",
    "view", "view_as", "reshape", "reshape_as", "contiguous", "is_contiguous", "size", "shape", "stride", "numel",
    "dim", "ndim", "ndimension", "element_size", "data_ptr", "storage_offset", "to", "type", "cuda", "cpu", "float",
    "half", "bfloat16", "double", "int", "long", "bool", "device", "dtype", "get_device", "is_cuda", "detach",
    "unsqueeze", "squeeze", "flatten", "unflatten", "expand", "expand_as", "permute", "transpose", "t", "T",
    "as_strided", "narrow", "select", "split", "chunk", "unbind", "movedim", "item", "tolist", "numpy", "fill_",
    "zero_", "copy_", "clone", "requires_grad_", "register_buffer", "register_parameter", "Parameter",
    "manual_seed", "cdiv", "next_power_of_2", "synchronize", "current_device", "current_stream", "Stream", "Event",
    "is_available", "set_device", "device_count", "get_device_properties", "no_grad", "inference_mode",
    "finfo", "iinfo", "broadcast_shapes", "broadcast_tensors", "stack", "cat", "len", "isinstance", "range", "max",
    "min", "tuple", "list", "dict", "print", "super", "__init__", "Module", "ModuleList", "Sequential",
    "load_inline", "load", "jit", "autotune", "heuristics", "Config", "program_id", "num_programs",
})

# Calls that make a ModelNew "pure PyTorch" when nothing custom is around (nn layers in forward).
_NN_PREFIXES = ("torch", "F", "nn", "torch.nn", "torch.nn.functional", "functional")

# Calls an except-handler may make without computing the answer some other way.
_HANDLER_OK = frozenset({"print", "warn", "format", "debug", "info", "warning", "error", "exception", "append",
                         "str", "repr", "len", "isinstance", "getattr", "hasattr", "exit", "_exit", "join"})

_PATCH_TARGETS = ("torch", "time", "triton", "torch.cuda", "torch.Tensor", "torch.nn.functional", "F", "np", "numpy")

# What a kernel module may import (top-level package), and the parts of torch it may not.
ALLOWED_IMPORTS = frozenset({"torch", "triton", "math", "functools", "typing", "typing_extensions", "dataclasses",
                             "collections", "itertools", "operator", "enum", "abc", "numbers", "numpy", "__future__",
                             "warnings"})
_BANNED_SUBMODULES = ("torch.multiprocessing", "torch.hub", "torch.package", "torch.serialization",
                      "torch.distributed", "torch.utils.data", "torch.testing", "torch.library", "torch.ops",
                      "torch.overrides", "numpy.lib", "numpy.ma") + NATIVE_BUILDS
# Reached by any path (import, alias or attribute): re-registering or intercepting torch's own ops, and
# the loaders that unpickle (run code the static check never saw) or write files for the candidate.
_BANNED_PATHS = _BANNED_SUBMODULES + (
    "torch.load", "torch.save", "torch.jit.load", "torch.jit.save", "numpy.load", "numpy.loads", "numpy.save",
    "numpy.savez", "numpy.savez_compressed", "numpy.savetxt", "numpy.loadtxt", "numpy.genfromtxt",
    "numpy.fromfile", "numpy.fromregex", "numpy.memmap", "numpy.DataSource", "numpy.ctypeslib", "torch.from_file",
    "torch.utils.collect_env",
    # Attribute lookup by a name written as text: `attrgetter("__closure__")` is `f.__closure__`.
    "operator.attrgetter", "operator.methodcaller")
_BANNED_METHODS = frozenset({"tofile", "dump"})  # ndarray methods that pickle or write files
# Modules that reach the interpreter's internals, files or processes, by whatever attribute path.
_FORBIDDEN_MODULE_NAMES = frozenset({"sys", "os", "gc", "inspect", "ctypes", "importlib", "builtins", "subprocess",
                                     "socket", "pickle", "marshal", "shutil", "pathlib", "threading", "_thread",
                                     "multiprocessing", "kforge", "mmap", "tempfile", "runpy", "posix", "faulthandler",
                                     "serialization", "hub"})
_BANNED_NAMES = frozenset({"exec", "eval", "compile", "__import__", "open", "globals", "locals", "vars",
                           "breakpoint", "input", "__builtins__", "__loader__", "__spec__", "memoryview",
                           "delattr"})
# The dispatcher's doors, as attributes of anything (`same(torch).library` resolves to no import): a kernel
# registered for an op runs inside the harness's own copies (the child's isolation.DispatchSeal is the run-time check).
_DISPATCH_ATTRS = frozenset({"library", "_library", "ops", "_ops", "overrides", "_C", "_python_dispatch", "aten",
                             "Library", "_Library", "py_impl", "_op_dk", "enable_python_dispatcher",
                             "_EnablePythonDispatcher", "_DisablePythonDispatcher"})
_FRAME_ATTRS = frozenset({"f_back", "f_globals", "f_locals", "f_builtins", "f_code", "gi_frame", "cr_frame",
                          "ag_frame", "tb_frame", "tb_next", "co_code", "co_consts", "co_filename", "func_globals",
                          "modules", "_getframe", "settrace", "setprofile", "get_objects", "get_referrers",
                          "cell_contents"})
_DUNDER_OK = frozenset({"__init__", "__name__", "__call__"})
# A dunder name inside any text but a docstring or C/CUDA source for load_inline: `"{0.__globals__}".format(f)`.
_DUNDER_TEXT = re.compile(r"__[A-Za-z]\w*__")
_TEXT_OK = _DUNDER_OK | {"__main__"}
_ATTR_FUNCS = ("getattr", "setattr", "hasattr")
# Methods that run the candidate's code at times the harness does not choose, or intercept torch itself.
_HOOK_METHODS = frozenset({"__torch_function__", "__torch_dispatch__", "__del__", "__getattr__", "__getattribute__",
                           "__init_subclass__", "__set_name__", "__class_getitem__", "__array__",
                           "__array_function__", "__array_ufunc__"})
_SUBCLASS_ATTRS = frozenset({"as_subclass", "register_forward_hook", "register_forward_pre_hook",
                             "register_full_backward_hook", "register_hook", "register_module_forward_hook"})
_KERNEL_DECORATORS = ("triton.jit", "triton.autotune", "triton.heuristics", "triton.runtime.jit",
                      "triton.runtime.autotune", "triton.runtime.autotuner.autotune", "triton.runtime.jit.jit")


@dataclass
class StaticReport:
    errors: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    kernels: list[str] = field(default_factory=list)  # names of @triton.jit functions / load_inline calls


def _dotted(node: ast.AST) -> str:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    elif isinstance(node, ast.Call):
        parts.append(_dotted(node.func) + "()")
    return ".".join(reversed(parts))


def _resolve(name: str, aliases: dict[str, str]) -> str:
    """`tl.load` -> `triton.language.load` through the module's import aliases ('' when not imported)."""
    head, _, rest = name.partition(".")
    full = aliases.get(head)
    if full is None:
        return ""
    return f"{full}.{rest}" if rest else full


def _is_triton_jit(dec: ast.AST, aliases: dict[str, str]) -> bool:
    """A decorator that resolves, through the imports, to Triton's own jit/autotune/heuristics (a
    home-made function that happens to be called `jit` does not)."""
    target = dec.func if isinstance(dec, ast.Call) else dec
    return _resolve(_dotted(target), aliases) in _KERNEL_DECORATORS


def reference_ops(problem_code: str) -> set[str]:
    """Names of the PyTorch ops the reference Model uses (calls, nn layers, the @ operator)."""
    ops: set[str] = set()
    try:
        tree = parse(problem_code)
    except SyntaxError:
        return ops
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"]:
        for node in ast.walk(cls):
            if isinstance(node, ast.Call):
                name = _dotted(node.func)
                leaf = name.rsplit(".", 1)[-1]
                if name.startswith("self.") and name.count(".") == 1:
                    continue  # self.layer(x): the layer's constructor is counted instead
                if leaf and leaf not in GLUE_OPS:
                    ops.add(leaf)
                    if leaf[:1].isupper():  # nn.Linear in __init__ also rules out F.linear in forward
                        ops.add(leaf.lower())
            elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
                ops.add("matmul")
    return ops


def _banned_path(full: str, allowed: frozenset[str] = frozenset()) -> bool:
    return full not in allowed and any(full == b or full.startswith(b + ".") for b in _BANNED_PATHS)


class _CandidateVisitor(ast.NodeVisitor):
    def __init__(self, ref_ops: set[str], aliases: dict[str, str], allowed: frozenset[str] = frozenset()) -> None:
        self.ref_ops = {op_key(o) for o in ref_ops}  # one key per op, however it is spelled (op_names.py)
        self.aliases, self.allowed = aliases, allowed  # import aliases; banned paths the backend may use
        self.report = StaticReport()
        self.banned_lines: set[int] = set()
        self.called: set[int] = set()  # ids of the nodes that are called (a Call's func)
        self.docstrings: set[int] = set()  # ids of the string constants that are statements of their own
        self.native: set[int] = set()  # ids of the string constants that only reach load_inline (C/CUDA source)
        self.in_kernel = 0
        self.func_stack: list[str] = []
        self.layer_ctor: dict[str, str] = {}  # self.<attr> -> nn layer name, from ModelNew.__init__

    # --- structure -------------------------------------------------------------------------
    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        for base in node.bases:
            if _resolve(_dotted(base), self.aliases) in ("torch.Tensor", "torch._C.TensorBase", "torch.nn.Parameter"):
                self._ban("a torch.Tensor subclass (its values could be computed lazily)", node)
            if _dotted(base).rsplit(".", 1)[-1] == "Model":
                self.report.flags.append("subclasses_reference_model")
        self.generic_visit(node)

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        if node.name in _HOOK_METHODS:
            self._ban(f"defining `{node.name}`", node)
        is_kernel = any(_is_triton_jit(d, self.aliases) for d in node.decorator_list)
        if is_kernel:
            self.report.kernels.append(node.name)
            self.in_kernel += 1
        self.func_stack.append(node.name)
        self.generic_visit(node)
        self.func_stack.pop()
        if is_kernel:
            self.in_kernel -= 1

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    # --- what the host code calls ------------------------------------------------------------
    def _in_init(self) -> bool:
        return bool(self.func_stack) and self.func_stack[-1] == "__init__"

    def visit_Assign(self, node: ast.Assign) -> None:
        for tgt in node.targets:
            name = _dotted(tgt)
            head = name.rsplit(".", 1)[0] if "." in name else ""
            if head in _PATCH_TARGETS or head.startswith("torch.") or head.startswith("time"):
                self.report.flags.append(f"patches:{name}")
            if self._in_init() and name.startswith("self.") and isinstance(node.value, ast.Call):
                ctor = _dotted(node.value.func)
                if _resolve(ctor, self.aliases).startswith("torch.") and ctor.rsplit(".", 1)[-1][:1].isupper():
                    self.layer_ctor[name.split(".", 1)[1]] = ctor.rsplit(".", 1)[-1]
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = _dotted(node.func)
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("load_inline", "load") and (name.endswith("load_inline") or "cpp_extension" in name):
            self.report.kernels.append(EXTENSION_KERNEL)
        if name in ("getattr", "setattr", "hasattr"):
            literal = len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
            target = _dotted(node.args[0]) if node.args else ""
            if not literal or target.split(".")[0] in self.aliases or (name == "setattr" and target != "self"):
                self._ban(f"`{name}` with a computed name or on a module", node)
            elif str(node.args[1].value).startswith("__") or str(node.args[1].value) in _FRAME_ATTRS:
                self._ban(f"`{name}` of `{node.args[1].value}`", node)
        if leaf == "Model" and name in ("Model",) or name.endswith(".Model"):
            self.report.flags.append("calls_reference_model")
        if name == "type" and len(node.args) == 3:
            self._ban("`type()` with three arguments (a class made at run time)", node)
        if not self.in_kernel and not self._in_init():
            if name.startswith("self.") and name.count(".") == 1 and name[5:] in self.layer_ctor:
                layer = self.layer_ctor[name[5:]]
                if same_op(layer, self.ref_ops) and layer not in GLUE_OPS:
                    self.report.flags.append(f"pytorch_op:{layer}")
            else:
                self._flag_op(name)
        self.generic_visit(node)

    def _flag_op(self, name: str) -> None:
        """`pytorch_op:<name>` when `name` (a call or a reference) is one of the problem's ops by any spelling
        (op_names.py) reached through torch's imports (`nn.Softmax`, `from torch import relu as r`) or a tensor
        method (`x.relu_`); `math.sqrt` in a launch argument is not."""
        if not name or name.startswith("self.") or "()" in name:
            return
        resolved = _resolve(name, self.aliases)
        leaf = (resolved or name).rsplit(".", 1)[-1]
        if not same_op(leaf, self.ref_ops) or leaf in GLUE_OPS:
            return
        if resolved.startswith("torch") or (not resolved and "." in name):
            self.report.flags.append(f"pytorch_op:{leaf}")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.MatMult) and not self.in_kernel and same_op("matmul", self.ref_ops):
            self.report.flags.append("pytorch_op:matmul")
        self.generic_visit(node)

    def visit_Try(self, node: ast.Try) -> None:
        # A handler that computes something with torch is a fallback: the kernel may never run.
        if not self.in_kernel:
            for handler in node.handlers:
                for sub in ast.walk(ast.Module(body=handler.body, type_ignores=[])):
                    if isinstance(sub, ast.Call):
                        name = _dotted(sub.func)
                        leaf = name.rsplit(".", 1)[-1]
                        harmless = leaf in _HANDLER_OK or leaf.endswith(("Error", "Exception", "Warning"))
                        if not harmless and (leaf not in GLUE_OPS or "forward" in name):
                            self.report.flags.append("try_except_fallback")
                            break
        self.generic_visit(node)

    visit_TryStar = visit_Try  # type: ignore[assignment]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if any(a.name == "Model" for a in node.names):
            self.report.flags.append("imports_reference_model")
        module = node.module or ""
        if node.level or not self._import_ok(module) and module not in self.allowed:
            self._ban(f"import from `{'.' * node.level}{module}`", node)
        for a in node.names:
            if a.name == "*" or a.name.startswith("_") or a.name in _FORBIDDEN_MODULE_NAMES or a.name in _DISPATCH_ATTRS \
                    or _banned_path(f"{module}.{a.name}", self.allowed):
                self._ban(f"`from {module} import {a.name}`", node)
        self.generic_visit(node)

    # --- what a kernel never needs -------------------------------------------------------------
    def _ban(self, what: str, node: ast.AST) -> None:
        self.report.errors.append(f"not allowed in a kernel: {what} (line {getattr(node, 'lineno', '?')})")

    @staticmethod
    def _import_ok(module: str) -> bool:
        parts = module.split(".")
        if parts[0] not in ALLOWED_IMPORTS or any(p.startswith("_") for p in parts[1:]):
            return False
        return not any(module == b or module.startswith(b + ".") for b in _BANNED_SUBMODULES)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if not self._import_ok(a.name) and a.name not in self.allowed:
                self._ban(f"`import {a.name}`", node)
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if node.id in _ATTR_FUNCS and id(node) not in self.called:  # `reduce(getattr, ...)`: a name as data
            self._ban(f"`{node.id}` passed around (not called with a literal name)", node)
        if node.id in _BANNED_NAMES or node.id in _FORBIDDEN_MODULE_NAMES and node.id not in self.aliases:
            self._ban(f"`{node.id}`", node)
        if isinstance(node.ctx, ast.Load) and not self.in_kernel and not self._in_init() and node.id in self.aliases:
            self._flag_op(node.id)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and node.value in _HOOK_METHODS:
            self._ban(f"the name `{node.value}` as text (a hook set up at run time)", node)
        elif isinstance(node.value, str) and id(node) not in self.docstrings and id(node) not in self.native:
            hidden = [d for d in _DUNDER_TEXT.findall(node.value) if d not in _TEXT_OK]
            if hidden:  # whatever looks it up (a helper, a format string) reaches what `.{hidden}` would
                self._ban(f"the name `{hidden[0]}` as text", node)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        attr = node.attr
        base = _dotted(node.value)
        on_module = base.split(".")[0] in self.aliases and _resolve(base, self.aliases) != ""
        if attr.startswith("__") and attr.endswith("__") and attr not in _DUNDER_OK:
            self._ban(f"the attribute `{attr}`", node)
        elif attr in _FRAME_ATTRS or attr in _FORBIDDEN_MODULE_NAMES or attr in _SUBCLASS_ATTRS or attr in _DISPATCH_ATTRS:
            self._ban(f"`.{attr}`", node)
        elif on_module and attr.startswith("_"):
            self._ban(f"the private attribute `{base}.{attr}`", node)
        if isinstance(node.ctx, (ast.Store, ast.Del)) and on_module:
            self._ban(f"assigning to `{base}.{attr}` (patching a library)", node)
        full = _resolve(f"{base}.{attr}", self.aliases) if base else ""
        if full and _banned_path(full, self.allowed) and node.lineno not in self.banned_lines:
            self.banned_lines.add(node.lineno)
            self._ban(f"`{full}`", node)
        elif attr in _BANNED_METHODS:
            self._ban(f"`.{attr}`", node)
        if isinstance(node.ctx, ast.Load) and not self.in_kernel and not self._in_init():
            self._flag_op(f"{base}.{attr}" if base else attr)
        self.generic_visit(node)


def _hidden_attr(attr: str) -> bool:
    return (attr.startswith("__") and attr.endswith("__") and attr not in _DUNDER_OK) or attr in _FRAME_ATTRS


def check_source(code: str, problem_code: str, backend: str) -> StaticReport:
    """Run every static check on a candidate (see the module docstring for errors vs flags)."""
    try:
        tree = parse(code)
    except SyntaxError as exc:
        rep = StaticReport()
        rep.errors.append(f"SyntaxError: {exc.msg} (line {exc.lineno})")
        return rep
    rule = KERNEL_BACKENDS.get(backend)
    visitor = _CandidateVisitor(reference_ops(problem_code), import_aliases(tree),
                                native_builds_allowed(rule is not None and rule.kernel == "extension"))
    visitor.called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    visitor.docstrings = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)
                          and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)}
    visitor.native = compiler_text(tree, lambda f: _resolve(_dotted(f), visitor.aliases))
    visitor.visit(tree)
    for what, node in hidden_lookups(tree, lambda f: _resolve(_dotted(f), visitor.aliases), _hidden_attr):
        visitor._ban(what, node)
    rep = visitor.report
    rep.flags = sorted(set(rep.flags))
    if not any(isinstance(n, ast.ClassDef) and n.name == "ModelNew" for n in ast.walk(tree)):
        if not any(isinstance(n, (ast.Assign, ast.ImportFrom)) and "ModelNew" in ast.dump(n) for n in tree.body):
            rep.errors.append("no `class ModelNew` defined: the candidate must define ModelNew(nn.Module)")
    if rule is not None and not rule.has_kernel(rep.kernels):
        rep.errors.append(rule.missing_kernel)
    return rep
