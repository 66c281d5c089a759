"""A template answer: a module whose kernel computes 2x+1 on its first input, the same on every problem.

Judged by the real evaluator (sandboxed children, Triton interpreter on the CPU), it compiles everywhere
and is wrong everywhere. Before: format + compile credit on every problem (0.4 a turn in tiny, 0.3 in
default, 0.2 in raicl), and with raicl's std normalisation, alone among failures, advantage +2.65: what a
correct kernel gets in its place.
"""

from __future__ import annotations

import math

import pytest

from kforge.config.loader import resolve
from kforge.config.schema import EvaluatorConfig
from kforge.credit.advantages import assign_returns, build_samples
from kforge.credit.rewards import score_trajectories, score_turn
from kforge.credit.templates import fingerprint
from kforge.evaluator import EvalPool, Status, Verdict
from kforge.policy.records import Candidate, Trajectory, Turn
from kforge.problems import builtin_problems, find_problem
from kforge.train.metrics import collapse_warnings

TEMPLATE = """import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def affine_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=m) * 2.0 + 1.0, mask=m)


class ModelNew(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()

    def forward(self, x, *rest):
        out = torch.empty_like(x)
        affine_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out
"""

# The same template renamed and reformatted: still the same answer.
RENAMED = (TEMPLATE.replace("affine_kernel", "my_kernel").replace("x_ptr", "src")
           .replace("import triton.language as tl", "import triton.language as language").replace("tl.", "language."))

KEYS = ("1/3", "1/4", "1/6")  # ReLU, GELU, Sigmoid


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict[str, Verdict]:
    cfg = EvaluatorConfig(num_correct_trials=2, run_timeout_s=30.0, compile_timeout_s=60.0, measure_performance=False,
                          memory_limit_gb=4.0, cpu_workers=2)
    problems = builtin_problems()
    items = [(find_problem(problems, k), TEMPLATE, "triton") for k in KEYS]
    items.append((find_problem(problems, "1/3"), find_problem(problems, "1/3").solution, "triton"))
    with EvalPool(cfg, devices=None, cache_dir=tmp_path_factory.mktemp("cache")) as pool:
        out = pool.evaluate_many(items, measure=False)
    return {**dict(zip(KEYS, out[:-1])), "correct": out[-1]}


def turn(key: str, code: str | None, verdict: Verdict | None, index: int = 0) -> Turn:
    return Turn(index, [1, 2], [3] * 20, "", [0.0] * 20, 0, candidate=Candidate(key, code), verdict=verdict)


def test_the_template_compiles_everywhere_and_is_wrong_everywhere(verdicts):
    for key in KEYS:
        v = verdicts[key]
        assert v.status is Status.INCORRECT and v.status.compiled and not v.flags, (key, v)
    assert verdicts["correct"].status is Status.CORRECT
    # One attempt on its own is still graded as an attempt: the structure is there and it compiled.
    for preset, expected in (("tiny", 0.4), ("default", 0.3), ("raicl", 0.2)):
        cfg = resolve(preset=preset).config
        score, _ = score_turn(turn("1/3", TEMPLATE, verdicts["1/3"]), cfg.reward, cfg.episode.thinking)
        assert score == pytest.approx(expected)


@pytest.mark.parametrize("preset", ["tiny", "default", "raicl"])
def test_a_template_repeated_across_problems_earns_no_shaping_credit(verdicts, preset):
    cfg = resolve(preset=preset).config
    step = [Trajectory(key, g, turns=[turn(key, TEMPLATE if g % 2 else RENAMED, verdicts[key])])
            for key in KEYS for g in range(2)]
    # An honest attempt with no kernel in forward yet: a third of the structure, on one problem only.
    honest = "import torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    step.append(Trajectory("1/4", 2, turns=[turn("1/4", honest, None)]))
    stats = score_trajectories(step, cfg.reward, cfg.episode.thinking)
    template_scores = [t.score for tr in step[:-1] for t in tr.turns]
    assert all(s <= 0.0 for s in template_scores), template_scores
    assert all(t.reward_components["format"] == 0.0 and t.reward_components["compile"] == 0.0
               for tr in step[:-1] for t in tr.turns)
    assert step[-1].turns[0].score > max(template_scores)  # the template is no longer the cheapest credit
    assert stats["template_turns"] == 6.0 and stats["template_collapsed_groups"] == 2.0  # 1/4 also has the honest one
    warnings = collapse_warnings([], {f"advantage/{k}": v for k, v in stats.items()})
    assert any("collapsed to one answer" in w for w in warnings), warnings


def test_a_correct_answer_keeps_its_reward_and_a_single_attempt_is_not_a_template(verdicts):
    cfg = resolve(preset="tiny").config
    solution = find_problem(builtin_problems(), "1/3").solution
    step = [Trajectory("1/3", 0, turns=[turn("1/3", solution, verdicts["correct"])]),
            Trajectory("1/4", 0, turns=[turn("1/4", TEMPLATE, verdicts["1/4"])]),
            Trajectory("1/4", 1, turns=[turn("1/4", TEMPLATE, verdicts["1/4"])])]
    stats = score_trajectories(step, cfg.reward, cfg.episode.thinking)
    assert step[0].turns[0].score == pytest.approx(1.4)
    assert [t.score for t in step[1].turns + step[2].turns] == pytest.approx([0.4, 0.4])  # one problem: no template
    assert stats["template_turns"] == 0.0
    assert not any("collapsed" in w for w in collapse_warnings([], {f"advantage/{k}": v for k, v in stats.items()}))
    assert fingerprint(TEMPLATE) == fingerprint(RENAMED) != fingerprint(TEMPLATE.replace("2.0 + 1.0", "2.0 + 3.0"))


def test_shaping_credit_never_gets_a_correct_answers_advantage_under_std_normalisation(verdicts):
    """raicl (grpo, std-normalised), a group of 8 where everyone failed but one: that one's advantage
    is +2.65 (sqrt 7) when it is correct, and was the same when it was the template alone."""
    cfg = resolve(preset="raicl").config
    zero = Verdict(status=Status.COMPILE_ERROR, trials_passed=0, trials=2)

    def advantage_of_first(code: str, verdict: Verdict) -> float:
        group = [Trajectory("1/3", 0, turns=[turn("1/3", code, verdict)])]
        group += [Trajectory("1/3", g, turns=[turn("1/3", None, zero)]) for g in range(1, 8)]
        score_trajectories(group, cfg.reward, cfg.episode.thinking)
        assign_returns(group, cfg.episode.gamma)
        build_samples(group, cfg.learner, cfg.reward)
        return group[0].turns[0].advantage

    correct = advantage_of_first(find_problem(builtin_problems(), "1/3").solution, verdicts["correct"])
    template = advantage_of_first(TEMPLATE, verdicts["1/3"])
    assert correct == pytest.approx(math.sqrt(7), rel=1e-4)
    # Its 0.2 (format + compile) is 0.2 of a correct answer's correctness reward: so is its advantage.
    assert template == pytest.approx(0.2 * math.sqrt(7), rel=1e-4)
