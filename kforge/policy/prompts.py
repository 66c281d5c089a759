"""Prompts for one turn: instructions for the kernel backend, worked examples, the problem, and the
history of earlier attempts with the evaluator's feedback.

The chat template comes from the tokenizer (`apply_chat_template`), so any HF chat model works; a model
without one needs `model.chat_template`. The problem statement is never cut: when the prompt is over the
context budget, the oldest earlier attempts go first, then the worked examples.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

from kforge.errors import UserError
from kforge.kernel_backends import KERNEL_BACKENDS, SOLUTIONS_BACKEND, KernelBackend, names
from kforge.policy.examples import Example, ExampleRetriever
from kforge.problems.record import Problem

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from kforge.config.schema import KforgeConfig

FEW_SHOT_K = 3
KERNEL_OPEN, KERNEL_CLOSE = "<KERNEL>", "</KERNEL>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class PromptError(UserError):
    """The prompt cannot be built (bad option, no chat template, no examples); one line for the user."""


@dataclass(frozen=True)
class PromptOption:
    """One `dataset.prompt_option`: what its prompts show."""

    k: int  # worked examples shown (raicl: dataset.raicl_k)
    retrieves: bool  # the examples come from the example retriever (a RAG index), not the built-in suite
    compact: bool = False  # a few lines of instructions and an answer skeleton instead of the full rules


# The prompt options, the one place their names live (tests/house/test_choice_tables.py checks the schema's literal).
PROMPT_OPTIONS: dict[str, PromptOption] = {
    "zero_shot": PromptOption(k=0, retrieves=False),
    "one_shot": PromptOption(k=1, retrieves=False),
    "few_shot": PromptOption(k=FEW_SHOT_K, retrieves=False),
    "raicl": PromptOption(k=3, retrieves=True),
    "compact": PromptOption(k=0, retrieves=False, compact=True),
}


@dataclass(frozen=True)
class Attempt:
    """An earlier turn as the next prompt shows it: the code (None when nothing parsed) and the feedback."""

    code: str | None
    feedback: str
    thinking: str | None = None  # the attempt's <think> text; shown only with keep_thinking


@dataclass
class BuiltPrompt:
    text: str
    ids: list[int]
    examples: list[Example] = field(default_factory=list)
    dropped_attempts: int = 0
    dropped_examples: int = 0

    @property
    def prompt_tokens(self) -> int:
        return len(self.ids)


def _backend(backend: str) -> KernelBackend:
    if backend not in KERNEL_BACKENDS:
        raise PromptError(f"kernel backend {backend!r} is not one of {names()}")
    return KERNEL_BACKENDS[backend]


def system_prompt(backend: str, thinking: bool) -> str:
    rule = _backend(backend)
    how, must = rule.how, rule.must
    lines = [
        "You are an expert GPU kernel engineer. You are given a PyTorch module `Model`; write `ModelNew`, a "
        "drop-in replacement that computes the same outputs faster with custom kernels.",
        "",
        "Rules:",
        "- Define `class ModelNew(nn.Module)` whose `__init__` takes exactly the same arguments as `Model.__init__` "
        "and whose `forward` takes the same inputs and returns the same outputs (shapes and dtypes).",
        f"- {how}",
        f"- {must}",
        "- Give a complete, self-contained Python module with every import it needs; `get_inputs` and "
        "`get_init_inputs` are not needed.",
        "",
        "Answer format:",
    ]
    if thinking:
        lines.append(f"- First reason step by step inside {THINK_OPEN}...{THINK_CLOSE}.")
    else:
        lines.append("- Do not explain your reasoning; answer with the kernel only.")
    lines.append(
        f"- Put the whole module inside {KERNEL_OPEN} and {KERNEL_CLOSE}, as one fenced ```python code block, "
        f"and write nothing after {KERNEL_CLOSE}."
    )
    return "\n".join(lines)


# The compact option: a few lines of instructions and the shape of the answer instead of the full rules and
# worked examples. On a CPU the prompt's prefill is a large part of a step: with the Add problem the
# zero-shot prompt is 551 SmolLM2 tokens, this one 375.
COMPACT_SYSTEM = (
    "You write GPU kernels. Given a PyTorch `Model`, write `ModelNew` with the same constructor and forward "
    "signature that computes the same result with {how}. Answer with the whole module in exactly this form "
    "and nothing else:"
)


def compact_system_prompt(backend: str, thinking: bool) -> str:
    rule = _backend(backend)
    lines = [COMPACT_SYSTEM.format(how=rule.compact_how)]
    if thinking:
        lines.append(f"{THINK_OPEN}your reasoning{THINK_CLOSE}")
    lines.append(format_answer(rule.skeleton))
    return "\n".join(lines)


def format_answer(code: str) -> str:
    """The answer exactly as the model should write it (used for examples)."""
    return f"{KERNEL_OPEN}\n```python\n{code.strip()}\n```\n{KERNEL_CLOSE}"


def _fence(code: str) -> str:
    return f"```python\n{code.strip()}\n```"


def builtin_examples(backend: str = "triton") -> list[Example]:
    """The built-in problems that carry a reference solution, as worked examples (imported lazily: the
    problems package may be absent or still growing)."""
    try:
        from kforge.problems import builtin_problems
    except ImportError as exc:
        raise PromptError(f"built-in examples are unavailable ({exc}); pass examples explicitly") from None
    examples = []
    for problem in builtin_problems():
        if problem.solution:
            examples.append(
                Example(
                    name=problem.name,
                    pytorch_code=problem.code,
                    kernel_code=problem.solution,
                    backend=SOLUTIONS_BACKEND,
                    source="builtin",
                    problem_key=problem.key,
                )
            )
    return [e for e in examples if e.backend == backend]


def is_same_problem(example: Example, problem: Problem) -> bool:
    """An example must never show the problem being asked (that would hand over the answer)."""
    if example.problem_key is not None and example.problem_key == problem.key and example.source == problem.source:
        return True
    return example.name == problem.name or example.pytorch_code.strip() == problem.code.strip()


class PromptBuilder:
    """Builds the token ids of one turn's prompt.

    option: zero_shot | one_shot | few_shot (examples from `examples`, else the built-in suite's reference
    solutions) | raicl (examples from `retriever`) | compact (short instructions and an answer skeleton, no
    examples). The asked problem is never among its own examples.

    keep_thinking: the latest earlier attempt is shown with its ``<think>`` text (when it had one), so the
    model continues its own reasoning; older attempts show only code and feedback (context budget). Off,
    earlier thinking is dropped (Kevin-32B's choice: the context then holds more attempts).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        *,
        option: str = "one_shot",
        backend: str = "triton",
        thinking: bool = False,
        examples: list[Example] | None = None,
        retriever: ExampleRetriever | None = None,
        k: int | None = None,
        chat_template: str | None = None,
        keep_thinking: bool = False,
    ) -> None:
        if option not in PROMPT_OPTIONS:
            raise PromptError(f"prompt option {option!r} is not one of {', '.join(PROMPT_OPTIONS)}")
        self.rule = PROMPT_OPTIONS[option]
        if self.rule.retrieves and retriever is None:
            raise PromptError(
                f"prompt_option={option} needs an example retriever: build an index with `kforge rag build` "
                "and set dataset.rag_index_path"
            )
        self.tokenizer = tokenizer
        self.option = option
        self.backend = backend
        self.thinking = thinking
        self.retriever = retriever
        self.k = k if k is not None else self.rule.k
        self.keep_thinking = keep_thinking
        self.chat_template = chat_template or getattr(tokenizer, "chat_template", None)
        if not self.chat_template:
            name = getattr(tokenizer, "name_or_path", "the model")
            raise PromptError(
                f"tokenizer of {name} has no chat template; set model.chat_template to a Jinja chat template"
            )
        self.system = compact_system_prompt(backend, thinking) if self.rule.compact else system_prompt(backend, thinking)
        self._pool = examples
        self._cache: dict[str, list[Example]] = {}

    @classmethod
    def from_config(
        cls,
        cfg: "KforgeConfig",
        tokenizer: PreTrainedTokenizerBase,
        retriever: ExampleRetriever | None = None,
        examples: list[Example] | None = None,
    ) -> "PromptBuilder":
        option = cfg.dataset.prompt_option
        return cls(
            tokenizer,
            option=option,
            backend=cfg.dataset.backend,
            thinking=cfg.episode.thinking,
            examples=examples,
            retriever=retriever,
            k=cfg.dataset.raicl_k if option in PROMPT_OPTIONS and PROMPT_OPTIONS[option].retrieves else None,
            chat_template=cfg.model.chat_template,
            keep_thinking=cfg.episode.keep_thinking,
        )

    # ------------------------------------------------------------------ examples
    def examples_for(self, problem: Problem) -> list[Example]:
        """The worked examples shown with `problem` (cached per problem: every turn shows the same ones)."""
        if self.k == 0:
            return []
        cache_key = f"{problem.source}|{problem.key}|{problem.name}"
        if cache_key not in self._cache:
            if self.rule.retrieves:
                assert self.retriever is not None
                found = self.retriever.retrieve(problem, self.k)
            else:
                if self._pool is None:
                    self._pool = builtin_examples(self.backend)
                found = list(self._pool)
            chosen = [e for e in found if not is_same_problem(e, problem)][: self.k]
            if not chosen and not self.rule.retrieves:
                raise PromptError(
                    f"prompt_option={self.option} needs worked examples for {self.backend} besides problem "
                    f"{problem.key}, and none are available; use prompt_option=zero_shot"
                )
            self._cache[cache_key] = chosen
        return self._cache[cache_key]

    # ------------------------------------------------------------------ rendering
    def user_message(self, problem: Problem, examples: Sequence[Example], history: Sequence[Attempt], dropped: int = 0) -> str:
        parts: list[str] = []
        for i, ex in enumerate(examples, 1):
            parts.append(
                f"## Example {i}: {ex.name}\nThe architecture:\n{_fence(ex.pytorch_code)}\n"
                f"An answer:\n{format_answer(ex.kernel_code)}"
            )
        parts.append(f"## Your task\nWrite `ModelNew` for this architecture:\n{_fence(problem.code)}")
        if history:
            lines = ["## Your earlier attempts"]
            if dropped:
                lines.append(f"({dropped} older attempt{'s' if dropped > 1 else ''} left out for length.)")
            first = dropped + 1
            for n, attempt in enumerate(history, first):
                code = _fence(attempt.code) if attempt.code else "(no kernel could be read from the answer)"
                feedback = attempt.feedback.strip() or "(no feedback)"
                thought = (attempt.thinking or "").strip() if self.keep_thinking and n == first + len(history) - 1 else ""
                reasoning = f"Your reasoning:\n{THINK_OPEN}{thought}{THINK_CLOSE}\n" if thought else ""
                lines.append(f"### Attempt {n}\n{reasoning}{code}\nEvaluation: {feedback}")
            parts.append("\n\n".join(lines))
            parts.append(
                "Write an improved `ModelNew`: fix what failed, or make a correct kernel faster. "
                f"Answer in the same format: the complete module inside {KERNEL_OPEN}...{KERNEL_CLOSE}."
            )
        elif self.rule.compact:
            parts.append(f"Answer now, starting with {KERNEL_OPEN}.")
        else:
            parts.append(f"Answer with the complete module inside {KERNEL_OPEN}...{KERNEL_CLOSE}.")
        return "\n\n".join(parts)

    def messages(
        self, problem: Problem, history: Sequence[Attempt] = (), examples: Sequence[Example] | None = None, dropped: int = 0
    ) -> list[dict[str, str]]:
        if examples is None:
            examples = self.examples_for(problem)
        return [
            {"role": "system", "content": self.system},
            {"role": "user", "content": self.user_message(problem, examples, history, dropped)},
        ]

    def render(self, messages: list[dict[str, str]]) -> str:
        kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True, "chat_template": self.chat_template}
        # Templates with a thinking switch (Qwen3 style) read `enable_thinking`; others ignore it.
        kwargs["enable_thinking"] = self.thinking
        try:
            return self.tokenizer.apply_chat_template(messages, **kwargs)
        except Exception as exc:  # some templates refuse a system role: fold it into the user turn
            if messages and messages[0]["role"] == "system":
                merged = [{"role": "user", "content": messages[0]["content"] + "\n\n" + messages[1]["content"]}]
                try:
                    return self.tokenizer.apply_chat_template(merged, **kwargs)
                except Exception:
                    pass
            raise PromptError(f"chat template failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None

    def encode(self, text: str) -> list[int]:
        # The rendered template already holds any BOS it wants.
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def build(self, problem: Problem, history: Sequence[Attempt] = (), budget_tokens: int | None = None) -> BuiltPrompt:
        """The prompt for the next turn, within `budget_tokens` when that is possible without cutting the
        problem: drop the oldest attempts first, then examples from the end. A prompt that is still too long
        is returned whole (the caller shortens max_tokens or skips it)."""
        examples = list(self.examples_for(problem))
        history = list(history)
        dropped_attempts = 0
        dropped_examples = 0
        while True:
            text = self.render(self.messages(problem, history, examples, dropped_attempts))
            ids = self.encode(text)
            if budget_tokens is None or len(ids) <= budget_tokens:
                break
            if history:
                history.pop(0)
                dropped_attempts += 1
            elif examples:
                examples.pop()
                dropped_examples += 1
            else:
                break
        return BuiltPrompt(text, ids, examples, dropped_attempts, dropped_examples)
