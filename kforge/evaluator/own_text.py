"""What of a candidate child's error text may reach a prompt, built from what the parent knows is the
candidate's own.

A child may read anything its sandbox lets it read (the loader's files, /proc, the user list, its own
environment) and put it in an exception message, a traceback or its stderr; redacting what looks like
a host path or a secret always trails what a candidate can think of. So nothing of the child's text is
passed on as it is. From a traceback the parent keeps:

- the candidate's own frames: `candidate.py, line N, in NAME`, only where N is a line of the parent's
  copy of the source (a frame line is text the child wrote: its digits could spell anything), with that
  line quoted from the parent's copy (never the child's), NAME only when the source has it;
- the exception's type, when it is a name the source, the problem or kforge's vocabulary holds;
- its message, each word kept only when the candidate's source, the problem's source or kforge's
  vocabulary of error words holds it (other words become `…`), each number only when one of the two
  sources holds it (others become `#`), and only plain punctuation.

A CUDA build's compiler lines are kept as `FILE(LINE): error: MESSAGE` with the message filtered the same
way, FILE only when it is one of the files load_inline writes from the candidate's own text (`main.cpp`,
`cuda.cu`) and LINE only when the source is that long; otherwise `error: MESSAGE`. The messages (the
exception's and every compiler line's) hold at most MAX_MESSAGE characters together; the whole text at
most feedback.MAX_LINES lines of feedback.MAX_LINE characters and feedback.MAX_TEXT in all.
"""

from __future__ import annotations

import builtins
import re

from kforge.evaluator.feedback import MAX_LINE, MAX_LINES, MAX_TEXT

# Words of the error messages of Python, PyTorch, Triton and the CUDA compilers: none of them says
# anything about the machine the child ran on.
VOCABULARY = frozenset("""
a about above access accessed after all allocate allocated allocation already also an and another any are
argument arguments array as assert assertion at attempt attempting attribute available axis b backward be
because been before being below between block blocks bool both bound broadcast buffer but by c call called
calling calls can cannot cast change changed check compile compiled compiler compilation constant
constexpr contiguous conversion convert copy could cpu cuda cudaErrorIllegalAddress current d data
declaration declared defined device devices did different dim dimension dimensions divide division does
doesn double dtype dtypes during e each element elements else empty encountered end equal error errors
exceeded exceeds expected expects expression extension f failed false file first float float16 float32
float64 for found free from function functions g gb given got grad gradient grid has have identifier if
illegal implemented in incompatible index indexing indices input inputs instead int int32 int64 integer
into invalid is it item its kernel kernels keyword kib launch launched launches least length line list
load loaded local long mask match matrix max maximum may memory method mib min minimum mismatch missing
mode module modules more most multiple must n name named names need needs negative no non none not
nothing number object of on one only operand operands operation operator or other out output outputs
overflow pass passed permission pointer pointers positional program provided range rank read real
received reference required requires result return returned returns runtime same scalar second sequence
set shape shapes should singleton size sizes so some specified start step stride strides subscript
such support supported sure syntax take takes tensor tensors than that the their then there this to too
tried triton true try tuple two type types unable undefined unexpected unknown unsupported use used
using value values variable version view was were when where which while with within without would
wrong x y you zero Errno Permission denied Fatal Python Segmentation fault Aborted CUDA Triton PyTorch
torch nn functional tl OutOfMemoryError CompilationError CompileTimeAssertionFailure OutOfResources
InterpreterError AcceleratorError system directory exist exists detected killed signal process permitted
kforge sandbox candidate thread threads started lock down allowed changing dispatch entered still forward after
mode registered harness uses
""".split())
_LOWER = frozenset(w.lower() for w in VOCABULARY)

_EXCEPTIONS = frozenset(n for n, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException))
_FRAME = re.compile(r'File "(?P<path>[^"]*)", line (?P<line>\d+),? in (?P<name>\S+)')
_EXC_LINE = re.compile(r"^(?P<type>[A-Za-z_][\w.]*)(?::\s?(?P<msg>.*))?$")
_BUILD_LINE = re.compile(r"(?P<file>[\w.-]+\.(?:cu|cpp|cuh|h))[(:](?P<line>\d+)[):].*?\berror\b:?\s*(?P<msg>.*)")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|[ ()\[\]{}.,:;'\"=<>+\-*/%!?`|&^~@#]|.", re.S)
_GONE = re.compile(r"…(?:[^\w\s…]*…)+")
MAX_MESSAGE = 300  # the messages of one error text together: the words a candidate chooses
# The files torch's load_inline writes from the candidate's own source text, and the lines it adds to them
# (its includes, the Python bindings of each function) beyond what the candidate's file holds.
_BUILD_FILES = ("main.cpp", "cuda.cu")
_BUILD_HEADROOM = 32


def _words(*sources: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\d+", "\n".join(sources)))


def _filtered(text: str, own: set[str]) -> str:
    """Each word and number of `text` that `own` or the vocabulary holds; plain punctuation; nothing else."""
    out: list[str] = []
    for tok in _TOKEN.findall(text):
        if tok[0].isdigit():
            out.append(tok if tok in own else "#")
        elif tok[0].isalpha() or tok[0] == "_":
            out.append(tok if tok in own or tok.lower() in _LOWER or tok in _EXCEPTIONS else "…")
        elif tok in " ()[]{}.,:;'\"=<>+-*/%!?`|&^~@#":
            out.append(tok)
    return _GONE.sub("…", re.sub(r"\s+", " ", "".join(out)).strip())[:MAX_MESSAGE]


def _type_name(dotted: str, own: set[str]) -> str:
    """The exception's class name, when it is one: Python's own, or named like one and known."""
    last = dotted.rsplit(".", 1)[-1]
    named = re.search(r"(Error|Exception|Failure|Exit|Interrupt|Resources)$", last) is not None
    return last if last in _EXCEPTIONS or named and (last in VOCABULARY or last in own) else ""


def own_words(text: str, code: str, problem_code: str) -> str:
    """`text` (one message) reduced to the words and numbers the two sources or the vocabulary hold."""
    return _filtered(text, _words(code, problem_code))


def candidate_error(text: str, code: str, problem_code: str, max_lines: int = MAX_LINES) -> str:
    """The prompt's view of a candidate child's error `text` (a traceback, its stderr or a build log)."""
    lines = code.splitlines()
    own = _words(code, problem_code)
    out: list[str] = []
    raw = text.splitlines()
    build = False
    budget = [MAX_MESSAGE]  # what is left of the messages' characters

    def message(words: str) -> str:
        kept = _filtered(words, own)[:budget[0]]
        budget[0] -= len(kept)
        return kept

    for line in raw:
        frame = _FRAME.search(line)
        if frame and frame["path"].rsplit("/", 1)[-1] == "candidate.py":
            n = int(frame["line"])
            if not 1 <= n <= len(lines):  # not a line of its source: not a frame of its code
                continue
            name = frame["name"] if frame["name"] in own else "?"
            out.append(f"candidate.py, line {n}, in {name}")
            if lines[n - 1].strip():
                out.append("    " + lines[n - 1].strip())
            continue
        built = _BUILD_LINE.search(line)
        if built:
            build = True
            if budget[0] <= 0:  # the first errors are the compiler's own; later ones follow from them
                continue
            n = int(built["line"])
            ours = built["file"] in _BUILD_FILES and 1 <= n <= len(lines) + _BUILD_HEADROOM
            out.append(f"{built['file']}({n}): " * ours + f"error: {message(built['msg'])}")
    # The exception: the last unindented line that names an exception type, and what follows it (for a
    # build, the compiler's error lines above say it; its message is the whole command log).
    for i in range(len(raw) - 1, -1, -1):
        match = _EXC_LINE.match(raw[i])
        kind = _type_name(match["type"], own) if match else ""
        if kind:
            said = "" if build else " ".join([match["msg"] or ""] + [x.strip() for x in raw[i + 1:]])
            out.append(kind + (": " + message(said) if said.strip() else ""))
            break
    deduped = [x[:MAX_LINE] for k, x in enumerate(out) if x not in out[:k] or x.startswith("    ")]
    return "\n".join(deduped[-max_lines:])[-MAX_TEXT:]
