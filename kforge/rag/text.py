"""Code text helpers shared by the corpus, the leak guard and the retriever.

Two pieces of code count as "the same" when they differ only in comments, whitespace or blank lines;
`normalize_code` gives that canonical form and `code_hash` its digest. `code_tokens` and `jaccard` measure
how close two modules are, which the leak guard and the retriever use to spot a problem hiding under
another name.
"""

from __future__ import annotations

import hashlib
import io
import re
import tokenize

# Identifiers, numbers, and single operator characters: enough to compare modules, cheap to compute.
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|[^\sA-Za-z0-9_]")
_LINE_COMMENT = re.compile(r"//[^\n]*")
_BLOCK_COMMENT = re.compile(r"/\*.*?\*/", re.S)
_IMPORT_LINE = re.compile(r"(?m)^\s*(?:import\s+\S.*|from\s+\S+\s+import\s+.*)$")
_NAME_PREFIX = re.compile(r"^\d+[_\-\s]+")
# A Python module starts some line with one of these; CUDA/C++ sources never do.
_PYTHON_LINE = re.compile(r"(?m)^\s*(?:(?:def|class|import|from)\s|@\w)")


def _strip_python_comments(code: str) -> str | None:
    """The code without `#` comments; None when the text is not Python (fragments with unbalanced brackets).

    Fast path: a line whose `#` has no quote before it loses everything from the `#` on. Only when a quote
    precedes a `#` (it may sit in a string) does the slower Python tokenizer decide. Lines inside
    triple-quoted strings may lose a `#...` tail on the fast path; that is fine for comparing and
    embedding, which is all this is used for.
    """
    if "#" not in code:
        return code
    out: list[str] = []
    for line in code.splitlines():
        cut = line.find("#")
        if cut < 0:
            out.append(line)
            continue
        head = line[:cut]
        if "'" in head or '"' in head:
            return _tokenize_strip(code)
        out.append(head)
    return "\n".join(out)


def _tokenize_strip(code: str) -> str | None:
    try:
        tokens = [t for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type != tokenize.COMMENT]
        return tokenize.untokenize(tokens)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


def strip_comments(code: str) -> str:
    """Drop comments: Python `#` comments for Python modules (CUDA inside their string literals is left
    alone), else C/C++ `//` and `/* */` comments, keeping preprocessor lines such as `#include`."""
    if _PYTHON_LINE.search(code):
        stripped = _strip_python_comments(code)
        if stripped is not None:
            return stripped
    return _LINE_COMMENT.sub("", _BLOCK_COMMENT.sub(" ", code))


def normalize_code(code: str) -> str:
    """Comments removed and every run of whitespace collapsed to one space: the form that dedup compares."""
    return " ".join(strip_comments(code).split())


def code_hash(code: str) -> str:
    return hashlib.sha256(normalize_code(code).encode("utf-8")).hexdigest()


def code_tokens(code: str) -> frozenset[str]:
    """The set of normalised tokens (identifiers, numbers, operators) of `code`, comments removed."""
    return frozenset(_TOKEN.findall(strip_comments(code)))


def jaccard(a: frozenset[str], b: frozenset[str]) -> float:
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def bare_name(name: str) -> str:
    """A task name reduced to what identifies the operation: "19_ReLU" -> "relu", "Conv2d-BN" -> "conv2dbn"."""
    return re.sub(r"[^a-z0-9]", "", _NAME_PREFIX.sub("", name.strip()).lower())


def embedding_text(code: str) -> str:
    """What the embedder reads for a PyTorch module: imports, comments and extra whitespace removed, so
    the model's limited window (256 word pieces for MiniLM) holds the class, its docstring and shapes."""
    text = _IMPORT_LINE.sub("", strip_comments(code))
    lines = [" ".join(line.split()) for line in text.splitlines()]
    return "\n".join(line for line in lines if line)


_TRIPLE_STRING = re.compile(r'("""|\'\'\')(?:.|\n)*?\1')
# A one-line string literal (kept whole) or a number outside one (masked).
_STRING_OR_NUMBER = re.compile(
    r"\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|(?<![\w.])\d+(?:\.\d*)?(?:[eE][-+]?\d+)?"
)


def mask_literals(code: str) -> str:
    """Comments and docstrings (triple-quoted strings) gone, numbers replaced by 0: the module's structure,
    the same for one problem whatever its sizes or wording. Other strings stay: they can name what a
    module builds (KernelBench level 4 differs only in the model id string)."""
    text = _TRIPLE_STRING.sub('""', strip_comments(code))
    return _STRING_OR_NUMBER.sub(lambda m: m.group(0) if m.group(0)[0] in "\"'" else "0", text)


def structure_hash(code: str) -> str:
    """Equal for two modules that differ only in comments, docstrings, whitespace and numbers."""
    return hashlib.sha256(" ".join(mask_literals(code).split()).encode("utf-8")).hexdigest()
