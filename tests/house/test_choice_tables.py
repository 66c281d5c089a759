"""One table per choice: each choice of the config (backends, losses, speed forms, prompt options) is its
table, the schema's literal equal to it, and no code branches on a name of it outside the table."""

from __future__ import annotations

import ast

from source_tree import parse, sources


# -- one table per choice --------------------------------------------------------------------------------------
def _literal(model: type, name: str) -> list[str]:
    from typing import get_args

    return list(get_args(model.model_fields[name].annotation))


def test_each_choice_of_the_config_is_its_table():
    """A choice's names live in one table, read by name nowhere else; the schema's literal lists the same names
    in the same order (the literal is what a config is checked against when it is resolved)."""
    from kforge.config.losses import LOSSES
    from kforge.config.reward_order import REWARD_COMPONENTS, SPEED_FORMS
    from kforge.config.schema import DatasetConfig, LearnerConfig, RewardConfig
    from kforge.kernel_backends import KERNEL_BACKENDS
    from kforge.learner.losses import KL_LOSSES
    from kforge.policy.prompts import PROMPT_OPTIONS

    assert _literal(DatasetConfig, "backend") == list(KERNEL_BACKENDS)
    assert all(name == backend.name for name, backend in KERNEL_BACKENDS.items())
    assert _literal(DatasetConfig, "prompt_option") == list(PROMPT_OPTIONS)
    assert _literal(LearnerConfig, "loss_fn") == list(LOSSES)
    assert _literal(LearnerConfig, "kl_estimator") == list(KL_LOSSES)
    assert _literal(RewardConfig, "speed_form") == list(SPEED_FORMS)
    weights = [c.weight for c in REWARD_COMPONENTS.values()]
    assert sorted(weights) == sorted([f for f in RewardConfig.model_fields if f.endswith("_weight")] + ["flagged_penalty"])


def choice_branches(files: dict[str, str], choice: set[str], table: str = "kforge.kernel_backends") -> list[str]:
    """Branches on a choice's name (`backend == "cuda"`, `b not in ("triton", "cuda")`) and literals that list
    its names (a tuple, list or set of them only, a dict keyed by two or more) outside its table's module. Not
    branches: a torch device's type (`device.type == "cuda"`), a name as a key or module (`"triton" in
    sys.modules`, `x in ("torch", "triton", "math")`) and a config literal (`Literal["triton", "cuda"]`,
    checked against the table above)."""

    def listed(node: ast.AST | None) -> set[str]:
        if not isinstance(node, (ast.Tuple, ast.List, ast.Set)) or not node.elts:
            return set()
        if all(isinstance(e, ast.Constant) and e.value in choice for e in node.elts):
            return {e.value for e in node.elts}  # type: ignore[attr-defined]
        return set()

    def named(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in choice

    bad = []
    for module, source in files.items():
        if module == table:
            continue
        tree = parse(source)
        literals = {id(n.slice) for n in ast.walk(tree) if isinstance(n, ast.Subscript)
                    and getattr(n.value, "id", getattr(n.value, "attr", None)) == "Literal"}
        for node in ast.walk(tree):
            found = ""
            if isinstance(node, ast.Compare):
                operands = [node.left, *node.comparators]
                device = any(isinstance(o, ast.Attribute) and o.attr == "type" for o in operands)
                for left, op, right in zip(operands, node.ops, operands[1:]):
                    if isinstance(op, (ast.In, ast.NotIn)) and listed(right):
                        found = "branch"
                    elif not isinstance(op, (ast.In, ast.NotIn)) and not device and (named(left) or named(right)):
                        found = "branch"
            elif id(node) not in literals and len(listed(node)) > 1:
                found = "list"
            elif isinstance(node, ast.Dict) and sum(1 for k in node.keys if k is not None and named(k)) > 1:
                found = "table"
            if found:
                bad.append(f"{module}:{node.lineno}: {found} {ast.unparse(node)[:60]}")
    return sorted(bad)


def test_the_kernel_backends_are_branched_on_and_listed_in_their_table_only():
    from kforge.kernel_backends import KERNEL_BACKENDS

    assert choice_branches(sources(), set(KERNEL_BACKENDS)) == []  # 24 in 12 modules before the table


def test_the_losses_speed_forms_and_prompt_options_are_branched_on_in_their_tables_only():
    from kforge.config.losses import LOSSES
    from kforge.config.reward_order import SPEED_FORMS
    from kforge.policy.prompts import PROMPT_OPTIONS

    files = sources()
    assert choice_branches(files, set(LOSSES), "kforge.config.losses") == []
    assert choice_branches(files, set(SPEED_FORMS), "kforge.config.reward_order") == []
    assert choice_branches(files, set(PROMPT_OPTIONS), "kforge.policy.prompts") == []


def test_the_backend_check_sees_a_branch_a_list_and_a_table():
    files = {"kforge.ops.doctor": 'need = cfg.dataset.backend == "cuda"\nok = b not in ("triton", "cuda")\n',
             "kforge.rag.corpus": 'HUB = {"triton": "kernelbook", "cuda": "sakana"}\nif "cuda" != kind: pass\n',
             "kforge.learner.ddp": 'gpu = self.device.type == "cuda"\n',
             "kforge.problems.selfcheck": 'a = "triton" in sys.modules\nb = m in ("torch", "triton", "math")\n',
             "kforge.config.schema": 'backend: Literal["triton", "cuda"] = "triton"\n',
             "kforge.kernel_backends": 'if backend == "cuda": pass\n'}
    assert choice_branches(files, {"triton", "cuda"}) == [
        "kforge.ops.doctor:1: branch cfg.dataset.backend == 'cuda'",
        "kforge.ops.doctor:2: branch b not in ('triton', 'cuda')",
        "kforge.ops.doctor:2: list ('triton', 'cuda')",
        "kforge.rag.corpus:1: table {'triton': 'kernelbook', 'cuda': 'sakana'}",
        "kforge.rag.corpus:2: branch 'cuda' != kind"]
