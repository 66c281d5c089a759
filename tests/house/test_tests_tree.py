"""The tests' own shape, read with `ast` (nothing is imported). The folders mirror kforge's packages
(tests/evaluator/ tests kforge/evaluator/), beside tests/bench/ (the benches' own parts), tests/house/ (rules
for the whole checkout), tests/support/ (helpers) and tests/candidates/ (kernels fed to the judge); tests of
kforge's top-level modules sit at the root. No file under tests/ imports a test module (test_*.py), and helpers
are imported by their own name. What more than one test file needs lives in a helper module of tests/support/
(fake_parts, tiny_models, trainer_parts, ...), never in a test file another one imports: importing a test module
runs its set-up a second time, can collect its fixtures twice, and ties one file's tests to another's."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from locations import REPO, TESTS

# A factory named as "module:attribute", which a child process imports (VLLMBackend(engine=...), factory=...).
FACTORY = re.compile(r"(tests\.)?(\w+):\w+")


def _imported(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, dotted name) of every module `tree` imports, function-level imports and factory strings included;
    `from a import b` counts as both `a` and `a.b` (b may be a module)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and (m := FACTORY.fullmatch(node.value)):
            found.append((node.lineno, (m.group(1) or "") + m.group(2)))
    return found


def imports_of_test_modules(source: str) -> list[str]:
    """Where `source` imports a test module: `import test_x`, `from test_x import f`, `from tests.test_x import f`,
    `from tests import test_x`, or a "test_x:Name" factory."""
    bad = set()
    for line, name in _imported(ast.parse(source)):
        parts = name.split(".")
        parts = parts[1:] if parts[0] == "tests" else parts
        if parts and parts[0].startswith("test_"):
            bad.add((line, name))
    return [f"line {line}: {name}" for line, name in sorted(bad)]


def package_imports(source: str) -> list[str]:
    """Where `source` reaches a helper through the tests folder (`from tests.vt import ...`): that works only when
    the checkout's root is on sys.path (`python -m pytest`, not `pytest`); pytest puts tests/ there itself."""
    bad = {(line, name) for line, name in _imported(ast.parse(source)) if name.split(".")[0] == "tests" and "." in name}
    return [f"line {line}: {name}" for line, name in sorted(bad)]


# Test folders that are not a package of kforge: what each holds.
OWN_FOLDERS = {"bench": "the benches' own parts", "house": "rules for the whole checkout",
               "support": "helper modules, no tests", "candidates": "kernels fed to the judge, no tests"}


def _python_files() -> list[Path]:
    return sorted(p for p in TESTS.rglob("*.py") if "candidates" not in p.relative_to(TESTS).parts)


def _sources() -> dict[str, str]:
    return {str(p.relative_to(TESTS)): p.read_text() for p in _python_files()}


def _packages() -> set[str]:
    return {p.parent.name for p in (REPO / "kforge").glob("*/__init__.py")}


def misplaced(test_files: list[str], packages: set[str]) -> list[str]:
    """Test files (paths relative to tests/) outside the tree: in a folder that is neither a package of kforge
    nor one of OWN_FOLDERS, deeper than one folder, in a folder that holds no tests, or sharing a file name with
    another test file (pytest imports each test file by its name)."""
    bad, seen = [], {}
    for path in test_files:
        parts = path.split("/")
        if len(parts) > 2 or (len(parts) == 2 and parts[0] not in packages | {"bench", "house"}):
            bad.append(f"{path}: not in a folder named for a kforge package, bench/ or house/")
        if parts[-1] in seen:
            bad.append(f"{path}: the same name as {seen[parts[-1]]}")
        seen.setdefault(parts[-1], path)
    return bad


def test_test_folders_mirror_the_packages():
    files = [name for name in _sources() if name.split("/")[-1].startswith("test_")]
    assert not misplaced(files, _packages()), misplaced(files, _packages())
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders <= _packages() | set(OWN_FOLDERS), folders - _packages() - set(OWN_FOLDERS)
    helpers = [name for name in _sources() if not name.split("/")[-1].startswith("test_") and name != "conftest.py"]
    assert all(name.startswith("support/") for name in helpers), helpers


def test_the_tree_check_sees_a_stray_folder_a_deep_file_and_a_name_twice():
    assert misplaced(["learner/test_a.py", "house/test_b.py", "test_c.py"], {"learner"}) == []
    assert misplaced(["misc/test_a.py", "learner/deep/test_b.py", "learner/test_c.py", "bench/test_c.py"],
                     {"learner"}) == ["misc/test_a.py: not in a folder named for a kforge package, bench/ or house/",
                                      "learner/deep/test_b.py: not in a folder named for a kforge package, bench/ or "
                                      "house/", "bench/test_c.py: the same name as learner/test_c.py"]


def test_no_test_module_imports_another_test_module():
    bad = {name: found for name, source in _sources().items() if (found := imports_of_test_modules(source))}
    assert not bad, f"move what they share into a helper module: {bad}"


def test_helpers_are_imported_by_their_name_not_through_the_tests_folder():
    bad = {name: found for name, source in _sources().items() if (found := package_imports(source))}
    assert not bad, bad


def test_the_test_import_check_sees_every_way_of_importing_a_test_module():
    source = '''
import test_a
from test_b import helper
from tests.test_c import helper
from tests import test_d
ENGINE = "test_e:Engine"


def f():
    from test_f import g


import tiny_models
from fake_parts import FakePool
from tests import vt
FACTORY = "fake_parts:FaultyLearner"
TEXT = "test_g: not a factory"
'''
    assert imports_of_test_modules(source) == ["line 2: test_a", "line 3: test_b", "line 3: test_b.helper",
                                               "line 4: tests.test_c", "line 4: tests.test_c.helper",
                                               "line 5: tests.test_d", "line 6: test_e", "line 10: test_f",
                                               "line 10: test_f.g"]
    assert package_imports(source) == ["line 4: tests.test_c", "line 4: tests.test_c.helper", "line 5: tests.test_d",
                                       "line 15: tests.vt"]
