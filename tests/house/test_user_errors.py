"""One user-error type: every domain error a user can cause is a UserError under its own name, caught once
by the CLI and never re-wrapped."""

from __future__ import annotations

import ast

from source_tree import parse, sources


# -- one user-error type ---------------------------------------------------------------------------------------
def test_every_domain_error_for_the_user_is_a_user_error_under_its_own_name():
    import importlib

    from kforge.errors import UserError

    names = {"kforge.config.loader": "ConfigError", "kforge.rag.errors": "RagError", "kforge.gpus": "GpuIndexError",
             "kforge.policy.prompts": "PromptError", "kforge.credit.rewards": "RewardOrderError",
             "kforge.train.build": "SetupError", "kforge.train.placement": "PlacementError",
             "kforge.eval.results": "ResultsFileError",
             "kforge.eval.target": "EvalTargetError", "kforge.eval.build": "EvalSetupError",
             "kforge.space": "UnwritableFolder", "kforge.problems.sources": "ProblemSourceError",
             "kforge.runs.locate": "LocateError", "kforge.ops.export": "ExportError"}
    for module, name in names.items():
        cls = getattr(importlib.import_module(module), name)
        assert issubclass(cls, UserError) and issubclass(cls, ValueError), name


def user_error_classes(files: dict[str, str]) -> set[str]:
    """The names of UserError and every class that derives from it, read from the source."""
    bases = {node.name: {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
             for source in files.values() for node in ast.walk(parse(source)) if isinstance(node, ast.ClassDef)}
    found = {"UserError"}
    while grown := {name for name, of in bases.items() if name not in found and of & found}:
        found |= grown
    return found


def translations(files: dict[str, str]) -> list[tuple[str, bool]]:
    """Each `raise` inside `except ... as exc` whose new error is built from `exc` (str(exc), f"{exc}", ...), as
    ("module:line: except Names", is a re-wrap: every caught type is a UserError and the message is the
    caught one alone, `X(str(exc))`, which says nothing the caught error did not)."""
    users = user_error_classes(files)
    found = []
    for module, source in files.items():
        for handler in ast.walk(parse(source)):
            if not (isinstance(handler, ast.ExceptHandler) and handler.name and handler.type is not None):
                continue
            caught = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
            names = [t.id if isinstance(t, ast.Name) else getattr(t, "attr", "?") for t in caught]
            for node in ast.walk(handler):
                if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call)):
                    continue
                args = node.exc.args
                if not any(isinstance(n, ast.Name) and n.id == handler.name for a in args for n in ast.walk(a)):
                    continue
                alone = len(args) == 1 and ast.unparse(args[0]) == f"str({handler.name})"
                found.append((f"{module}:{node.lineno}: except {', '.join(names)}", alone and set(names) <= users))
    return sorted(found)


# Translations into the CLI's one line that remain, for errors that are not UserErrors: a model that cannot be
# loaded, a run that cannot be stopped (exit 1), the learner's own failure (its first line). This may only go down.
MAX_CLI_TRANSLATIONS = 7


def test_a_user_error_is_caught_once_and_never_re_wrapped():
    found = translations(sources())
    # The one catch: a UserError raised anywhere under a command becomes its one line (cli/common.py).
    assert [where.split(":")[0] for where, rewrap in found if rewrap] == ["kforge.cli.common"]
    in_cli = [where for where, _ in found
              if where.startswith("kforge.cli.") and not where.startswith("kforge.cli.common:")]
    assert len(in_cli) <= MAX_CLI_TRANSLATIONS, in_cli


def test_the_translation_check_sees_a_re_wrap_and_a_translation_with_context():
    files = {"kforge.cli.x": "class BadThing(UserError):\n    pass\n"
                             "try:\n    go()\nexcept BadThing as exc:\n    raise fail(str(exc)) from None\n",
             "kforge.eval.y": "try:\n    go()\nexcept (OSError, KeyError) as e:\n"
                              "    raise BadThing(f'{e}; pick --out') from None\n"}
    assert translations(files) == [("kforge.cli.x:6: except BadThing", True),
                                   ("kforge.eval.y:4: except OSError, KeyError", False)]
