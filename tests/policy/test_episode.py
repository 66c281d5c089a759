"""Multi-turn episodes: stop rules, history and feedback, the context budget, overlapping evaluations.

The evaluator is not used here: `grade_by_parsing` (tests/support/scripted_episodes.py) is a plain async function
that grades a candidate by reading it. It exists ONLY to drive the stop-rule logic; real verdicts come from the
evaluator pool. The stop-rule tests replay scripted responses (`ScriptedBackend`, tokenised with the real
tokenizer) so that each rule is exercised deterministically;
`test_real_model_episode` runs the engine with the real SmolLM2 backend.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from kforge.credit.rewards import COMPONENTS, score_trajectories, score_turn
from kforge.evaluator.verdict import Status, Verdict
from kforge.policy.episode import stop_reason_after
from kforge.policy.prompts import Attempt, PromptBuilder
from scripted_episodes import (
    KERNEL,
    NOT_A_MODEL,
    ScriptedBackend,
    answer,
    grade_by_parsing,
    make_cfg,
    run,
    smollm_tokenizer,
    three_problems,
)


@pytest.fixture(scope="module")
def tok():
    return smollm_tokenizer()


@pytest.fixture(scope="module")
def problems():
    return three_problems()


@pytest.mark.parametrize(
    "verdict,threshold,early,expected",
    [
        (Verdict(Status.CORRECT, speedup=1.1), None, True, "correct"),
        (Verdict(Status.CORRECT, speedup=1.1), None, False, None),
        (Verdict(Status.CORRECT, speedup=1.1), 1.5, True, None),  # correct but slow: refine
        (Verdict(Status.CORRECT, speedup=1.5), 1.5, False, "speedup_reached"),
        (Verdict(Status.CORRECT, speedup=None, timing_meaningful=False), 1.5, True, "correct"),
        (Verdict(Status.CORRECT, speedup=3.0, flags=["returns_input"]), 1.5, True, None),  # hacked: not correct
        (Verdict(Status.INCORRECT), None, True, None),
        (Verdict(Status.FORMAT_ERROR), 1.0, True, None),
    ],
)
def test_stop_reason_after(verdict, threshold, early, expected):
    cfg = make_cfg(speedup_threshold=threshold, early_stop_on_correct=early)
    assert stop_reason_after(verdict, cfg.episode) == expected


def test_early_stop_on_correct_and_format_errors_skip_the_evaluator(tok, problems):
    a, b, c = problems
    script = {
        a.key: [answer(KERNEL.format(s=1.0))],
        b.key: ["I am not sure how to write this.", answer(KERNEL.format(s=1.0))],
        c.key: [answer(NOT_A_MODEL), "<KERNEL>\n```python\nclass Broken(:\n", answer(NOT_A_MODEL)],
    }
    log: list[tuple[str, str]] = []
    backend = ScriptedBackend(tok, problems, script)
    builder = PromptBuilder(tok, option="zero_shot")
    turns_seen = []
    trajs = run(backend, builder, grade_by_parsing(log), make_cfg(), [(a, 0), (b, 1), (c, 0)],
                on_turn=lambda tr, t: turns_seen.append((tr.problem_key, t.index)))
    ta, tb, tc = trajs
    assert (ta.problem_key, ta.group_index, ta.stop_reason, len(ta.turns)) == (a.key, 0, "correct", 1)
    assert (tb.stop_reason, len(tb.turns)) == ("correct", 2)
    assert (tc.stop_reason, len(tc.turns)) == ("max_turns", 3)
    assert tb.turns[0].verdict.status is Status.FORMAT_ERROR and tb.turns[0].candidate.code is None
    assert tc.turns[1].verdict.status is Status.FORMAT_ERROR  # truncated and unparsable
    # Only parsed candidates reached the evaluator: a(0), b(1), c(0), c(2).
    assert sorted(k for k, _ in log) == sorted([a.key, b.key, c.key, c.key])
    assert len(turns_seen) == 6
    for traj in trajs:
        for i, turn in enumerate(traj.turns):
            assert turn.index == i and turn.policy_version == 7
            assert turn.prompt_tokens == len(turn.prompt_ids) > 0
            assert len(turn.logprobs) == len(turn.response_ids) > 0
            assert turn.score == 0.0 and turn.reward_components == {}  # the episode records verdicts only
    # Credit is the one writer of scores: from the verdicts the episode recorded.
    cfg = make_cfg()
    score_trajectories(trajs, cfg.reward, thinking=False)
    assert ta.turns[0].score == score_turn(ta.turns[0], cfg.reward, False)[0] > tc.turns[1].score
    assert set(tc.turns[1].reward_components) == set(COMPONENTS)


def test_history_carries_code_and_feedback_but_not_thinking(tok, problems):
    a = problems[0]
    script = {a.key: [answer(NOT_A_MODEL, think="SECRET-PLAN-0"), answer(KERNEL.format(s=1.0), think="plan 1")]}
    backend = ScriptedBackend(tok, problems, script)
    builder = PromptBuilder(tok, option="zero_shot", thinking=True)
    (traj,) = run(backend, builder, grade_by_parsing(), make_cfg(thinking=True), [(a, 0)])
    assert traj.turns[0].candidate.thinking == "SECRET-PLAN-0"
    second_prompt = tok.decode(traj.turns[1].prompt_ids)
    assert "Rejected before running: no class ModelNew." in second_prompt
    assert "def helper(x):" in second_prompt and "### Attempt 1" in second_prompt
    assert "SECRET-PLAN-0" not in second_prompt
    assert traj.stop_reason == "correct"


def test_speedup_threshold_keeps_refining_correct_but_slow_kernels(tok, problems):
    a, b = problems[:2]
    script = {
        a.key: [answer(KERNEL.format(s=1.1)), answer(KERNEL.format(s=1.3)), answer(KERNEL.format(s=2.0))],
        b.key: [answer(KERNEL.format(s=1.1)), answer(KERNEL.format(s=1.2)), answer(KERNEL.format(s=1.2))],
    }
    backend = ScriptedBackend(tok, problems, script)
    builder = PromptBuilder(tok, option="zero_shot")
    ta, tb = run(backend, builder, grade_by_parsing(), make_cfg(speedup_threshold=1.5), [(a, 0), (b, 0)])
    assert (ta.stop_reason, len(ta.turns)) == ("speedup_reached", 3)
    assert (tb.stop_reason, len(tb.turns)) == ("max_turns", 3)
    assert all(t.verdict.correct for t in ta.turns + tb.turns)
    # Where timing means nothing (CPU), the threshold cannot be judged: early_stop_on_correct decides.
    (tc,) = run(backend, builder, grade_by_parsing(meaningful=False), make_cfg(speedup_threshold=1.5), [(a, 0)])
    assert (tc.stop_reason, len(tc.turns)) == ("correct", 1)


def test_single_turn_mode(tok, problems):
    a = problems[0]
    backend = ScriptedBackend(tok, problems, {a.key: [answer(NOT_A_MODEL)] * 3})
    builder = PromptBuilder(tok, option="zero_shot")
    trajs = run(backend, builder, grade_by_parsing(), make_cfg(mode="single_turn"), [(a, g) for g in range(3)])
    assert [(t.group_index, len(t.turns), t.stop_reason) for t in trajs] == [(g, 1, "max_turns") for g in range(3)]


def test_evaluations_overlap(tok, problems):
    a = problems[0]
    backend = ScriptedBackend(tok, problems, {a.key: [answer(KERNEL.format(s=1.0))]})
    builder = PromptBuilder(tok, option="zero_shot")
    evaluate = grade_by_parsing(delay=0.3)
    start = time.perf_counter()
    trajs = run(backend, builder, evaluate, make_cfg(), [(a, g) for g in range(6)])
    elapsed = time.perf_counter() - start
    assert all(t.stop_reason == "correct" for t in trajs)
    assert evaluate.state["max_running"] == 6 and elapsed < 6 * 0.3


def test_context_budget_drops_oldest_attempts(tok, problems):
    a = problems[0]
    bulky = NOT_A_MODEL + "".join(f"# filler line {i} " + "x" * 40 + "\n" for i in range(20))
    backend = ScriptedBackend(tok, problems, {a.key: [answer(bulky)] * 4})
    builder = PromptBuilder(tok, option="zero_shot")
    bare = builder.build(a).prompt_tokens
    with_one = builder.build(a, [Attempt(bulky, "x")]).prompt_tokens
    budget = with_one + (with_one - bare) // 2  # room for one attempt, not two
    (traj,) = run(backend, builder, grade_by_parsing(), make_cfg(max_turns=4, context_budget_tokens=budget), [(a, 0)])
    assert [t.dropped_attempts for t in traj.turns] == [0, 0, 1, 2]
    assert all(t.prompt_tokens <= budget for t in traj.turns)
    last = tok.decode(traj.turns[3].prompt_ids)
    assert a.code.strip() in last and "### Attempt 3" in last and "### Attempt 1" not in last


@pytest.mark.slow
def test_real_model_episode(problems):
    """The engine with the real SmolLM2 HF backend: generation, parsing, feedback, every Turn field."""
    from kforge.rollout.hf import HFBackend
    from smollm import load_smollm

    model, tok = load_smollm()
    backend = HFBackend.from_model(model, tok, batch_size=4)
    builder = PromptBuilder(tok, option="zero_shot")
    cfg = make_cfg(max_turns=2, early_stop_on_correct=True)
    cfg.rollout.max_tokens = 5
    cfg.rollout.temperature = 1.0
    log: list[tuple[str, str]] = []
    jobs = [(problems[0], 0), (problems[1], 0)]
    trajs = run(backend, builder, grade_by_parsing(log), cfg, jobs)
    evaluated = 0
    for traj, (problem, group) in zip(trajs, jobs):
        assert traj.problem_key == problem.key and traj.group_index == group
        assert traj.stop_reason in ("correct", "max_turns")
        assert len(traj.turns) == (1 if traj.stop_reason == "correct" else 2)
        for turn in traj.turns:
            assert 1 <= len(turn.response_ids) <= 5 and len(turn.logprobs) == len(turn.response_ids)
            assert all(lp <= 0.0 for lp in turn.logprobs)
            assert turn.response_text == tok.decode(turn.response_ids, skip_special_tokens=True)
            # The engine labels each completion with the adapter it sampled with (none loaded: 0).
            assert turn.policy_version == backend.version == 0 and turn.prompt_tokens == len(turn.prompt_ids)
            assert problem.code.strip() in tok.decode(turn.prompt_ids)
            assert turn.candidate is not None and turn.verdict is not None
            if turn.candidate.code is None:
                assert turn.verdict.status is Status.FORMAT_ERROR
            else:
                evaluated += 1
        if len(traj.turns) == 2:
            assert traj.turns[0].verdict.feedback.splitlines()[0] in tok.decode(traj.turns[1].prompt_ids)
    assert len(log) == evaluated


def test_no_turn_barrier_a_step_takes_the_longest_chain_not_the_sum_of_slowest_turns(tok, problems):
    """Three trajectories, three turns each, every kernel rejected. One evaluation per turn is slow, each
    in a different trajectory: with a barrier per turn the phase takes 3 x SLOW; without one each chain
    takes SLOW + 2 x FAST and the chains overlap."""
    slow, fast = 1.0, 0.05
    a, b, c = problems
    script = {p.key: [answer(NOT_A_MODEL)] * 3 for p in problems}
    slow_at = {(a.key, 0), (b.key, 1), (c.key, 2)}
    calls: dict[str, int] = {}
    started: list[tuple[str, int, float]] = []
    t0 = time.perf_counter()

    async def evaluate(problem, code, backend):
        turn = calls.get(problem.key, 0)
        calls[problem.key] = turn + 1
        started.append((problem.key, turn, time.perf_counter() - t0))
        await asyncio.sleep(slow if (problem.key, turn) in slow_at else fast)
        return Verdict(Status.INCORRECT, feedback="wrong")

    backend = ScriptedBackend(tok, problems, script)
    builder = PromptBuilder(tok, option="zero_shot")
    t0 = time.perf_counter()
    trajs = run(backend, builder, evaluate, make_cfg(), [(a, 0), (b, 0), (c, 0)])
    elapsed = time.perf_counter() - t0
    assert [len(t.turns) for t in trajs] == [3, 3, 3]
    assert elapsed < slow + 2 * fast + 0.8, elapsed  # about the longest chain (1.1 s), far below 3 x slow
    assert elapsed >= slow
    # b and c finished all their fast turns while a's first evaluation was still running.
    start_of = {(k, t): s for k, t, s in started}
    assert start_of[(b.key, 1)] < start_of[(a.key, 1)] and start_of[(c.key, 2)] < start_of[(a.key, 1)]


def test_same_samples_whatever_the_evaluation_order(problems):
    """Each request carries a seed fixed by (seed, problem, group, turn), so the order in which verdicts
    come back (which decides how requests are batched) does not change what a trajectory samples."""
    from kforge.policy.episode import request_seed

    seeds = {request_seed(0, p.key, g, t) for p in problems for g in range(2) for t in range(3)}
    assert len(seeds) == len(problems) * 2 * 3  # distinct per request
    assert request_seed(0, problems[0].key, 1, 2) == request_seed(0, problems[0].key, 1, 2)
    assert request_seed(1, problems[0].key, 1, 2) != request_seed(0, problems[0].key, 1, 2)


def test_stop_after_k_consecutive_failed_turns(tok, problems):
    a, b = problems[:2]
    script = {a.key: [answer(NOT_A_MODEL)] * 4,
              b.key: [answer(NOT_A_MODEL), answer(KERNEL.format(s=1.0)), answer(NOT_A_MODEL), answer(NOT_A_MODEL)]}
    backend = ScriptedBackend(tok, problems, script)
    builder = PromptBuilder(tok, option="zero_shot")
    cfg = make_cfg(max_turns=4, max_failed_turns=2, early_stop_on_correct=False)
    ta, tb = run(backend, builder, grade_by_parsing(), cfg, [(a, 0), (b, 0)])
    assert (ta.stop_reason, len(ta.turns)) == ("failed_turns", 2)
    # A correct turn resets the count: fail, correct, fail, fail -> stops after turn 4.
    assert (tb.stop_reason, len(tb.turns)) == ("failed_turns", 4)
    (tc,) = run(backend, builder, grade_by_parsing(), make_cfg(max_turns=4), [(a, 0)])  # default: off
    assert (tc.stop_reason, len(tc.turns)) == ("max_turns", 4)


def test_turns_are_labelled_with_the_adapter_that_sampled_them(tok, problems):
    """Pipelined mode: the learner's new adapter reaches the engine while an episode is running; the turns
    sampled after that must carry the new version, not the one the episode started with."""
    a = problems[0]

    class VersionedBackend(ScriptedBackend):
        version = 7

        def _respond(self, prompt_ids):
            out = super()._respond(prompt_ids)
            out.policy_version = self.version
            return out

    backend = VersionedBackend(tok, problems, {a.key: [answer(NOT_A_MODEL)] * 3})
    inner = grade_by_parsing()

    async def evaluate(problem, code, be):
        backend.version = 8  # the adapter sync lands while turn 1 is being evaluated
        return await inner(problem, code, be)

    (traj,) = run(backend, PromptBuilder(tok, option="zero_shot"), evaluate, make_cfg(), [(a, 0)])
    assert [t.policy_version for t in traj.turns] == [7, 8, 8]


def test_one_way_to_build_a_runner_with_the_retriever_its_config_asks_for(tok, problems, tmp_path):
    """`EpisodeRunner.from_config` builds the runner of training and of `kforge eval`; `rag.retriever_for`
    loads the retriever a config asks for (none unless prompt_option=raicl) and says what is missing."""
    from kforge.policy.runner import EpisodeRunner
    from kforge.rag import RagError, retriever_for

    cfg = make_cfg(max_turns=2)
    assert retriever_for(cfg.dataset) is None
    log: list[tuple[str, str]] = []
    a = problems[0]
    backend = ScriptedBackend(tok, problems, {a.key: [answer(NOT_A_MODEL), answer(KERNEL.format(s=1.0))]})
    runner = EpisodeRunner.from_config(cfg, backend, grade_by_parsing(log), cache=False)
    assert runner.cache is None and runner.builder.option == cfg.dataset.prompt_option
    (traj,) = asyncio.run(runner.run([(a, 0)], policy_version=3, seed=1)).trajectories
    assert [t.verdict.correct for t in traj.turns] == [False, True] and len(log) == 2
    cfg.dataset.prompt_option = "raicl"
    with pytest.raises(RagError, match="needs dataset.rag_index_path"):
        retriever_for(cfg.dataset)
    cfg.dataset.rag_index_path = str(tmp_path / "no-index")
    with pytest.raises(RagError):
        retriever_for(cfg.dataset)
