"""A resolved config is never edited: a derived value is one more layer of the loader, never an
assignment to a config's field elsewhere."""

from __future__ import annotations

import ast

from source_tree import parse, sources

# -- a resolved config is never edited ------------------------------------------------------------------------
RESOLVE_STEP = {"kforge.config.loader"}  # builds a config from its layers (a derived value is one more layer)


def config_edits(files: dict[str, str]) -> list[str]:
    """Assignments (and setattr) to a config's fields: `X.section.field = ...` for a section of KforgeConfig and
    a field of it, or `cfg.field = ...`, outside the resolve step."""
    from pydantic import BaseModel

    from kforge.config.schema import KforgeConfig

    sections = {name: set(info.annotation.model_fields) for name, info in KforgeConfig.model_fields.items()
                if isinstance(info.annotation, type) and issubclass(info.annotation, BaseModel)}

    def edits(target: ast.expr) -> bool:
        if not isinstance(target, ast.Attribute):
            return False
        owner = target.value
        if isinstance(owner, ast.Attribute) and target.attr in sections.get(owner.attr, ()):
            return True  # cfg.model.name, self.cfg.log.run_name, ...
        named = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        return named in ("cfg", "config") and target.attr in KforgeConfig.model_fields

    bad = []
    for module, source in files.items():
        if module in RESOLVE_STEP:
            continue
        for node in ast.walk(parse(source)):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = [t for tgt in node.targets for t in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt])]
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr" and node.args:
                first = node.args[0]
                if isinstance(first, ast.Attribute) and first.attr in sections or getattr(first, "id", "") == "cfg":
                    bad.append(f"{module}:{node.lineno}: setattr on a config")
            bad += [f"{module}:{node.lineno}: {ast.unparse(t)} =" for t in targets if edits(t)]
    return sorted(bad)


def test_no_code_edits_a_resolved_config():
    assert config_edits(sources()) == []


def test_the_config_check_sees_an_edit():
    files = {"kforge.modelio": "cfg.model.max_model_len = limit\ncfg.episode.context_budget_tokens, x = 1, 2\n",
             "kforge.eval.runner": "self.cfg.model.name = self.target.model\n",
             "kforge.cli.train": "cfg.preset = 'x'\nsetattr(cfg.log, 'run_name', name)\n",
             "kforge.ops.export": "merged.config.use_cache = True\nself.model.device = 'cpu'\n",
             "kforge.config.loader": "cfg.model.name = 'resolving'\n"}
    assert config_edits(files) == [
        "kforge.cli.train:1: cfg.preset =", "kforge.cli.train:2: setattr on a config",
        "kforge.eval.runner:1: self.cfg.model.name =",
        "kforge.modelio:1: cfg.model.max_model_len =", "kforge.modelio:2: cfg.episode.context_budget_tokens ="]
