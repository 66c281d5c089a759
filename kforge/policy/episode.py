"""Multi-turn episodes: generate, parse, evaluate, feed the verdict back, stop or refine.

Each trajectory is its own chain of turns and never waits for another: its next prompt goes to the
engine as soon as its own verdict is back, while other trajectories are still generating or being
evaluated (`GenerationQueue` batches whatever is ready for an engine that takes one call at a time). A
step therefore takes about as long as its longest single chain, not the sum over turns of the slowest
evaluation. Each request carries its own seed (from the run seed, the problem, the group index and the
turn), so a trajectory's samples do not depend on which others it happened to share a batch with.

Responses without a readable kernel get a format-error verdict here and never reach the evaluator. This
module knows the evaluator only as an async function. It records verdicts and never scores them: a turn's
score, return and advantage are written by `kforge.credit` alone (the trainer's credit step).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import replace
from typing import TYPE_CHECKING, Awaitable, Callable

from kforge.evaluator.verdict import Verdict
from kforge.policy.parsing import format_error_verdict, parse_response
from kforge.policy.prompts import KERNEL_CLOSE, Attempt, PromptBuilder
from kforge.policy.records import Trajectory, Turn
from kforge.problems.record import Problem
from kforge.rollout.base import GenerationRequest, RolloutBackend, SamplingParams, sampling_from_config
from kforge.rollout.queue import GenerationQueue

if TYPE_CHECKING:
    from kforge.config.schema import EpisodeConfig, KforgeConfig

EvaluateFn = Callable[[Problem, str, str], Awaitable[Verdict]]  # (problem, code, backend) -> verdict
OnTurn = Callable[[Trajectory, Turn], None]

STOP_CORRECT = "correct"
STOP_SPEEDUP = "speedup_reached"
STOP_MAX_TURNS = "max_turns"
STOP_FAILED = "failed_turns"  # episode.max_failed_turns failed turns in a row
STOP_CONTEXT = "context_full"  # the prompt alone fills model.max_model_len


def stop_reason_after(verdict: Verdict, episode: "EpisodeConfig", failed_in_a_row: int = 0) -> str | None:
    """Why a trajectory stops after a turn with this verdict, or None to refine further.

    With `speedup_threshold` set, a correct kernel is refined until its measured speedup reaches it; where
    timing is not meaningful (CPU, Triton interpreter) the threshold cannot be judged and
    `early_stop_on_correct` decides instead. With `max_failed_turns` set, a trajectory whose last that
    many turns all failed (not correct) stops: more refinement of a hopeless attempt costs engine time."""
    if not verdict.correct:
        limit = episode.max_failed_turns
        return STOP_FAILED if limit and failed_in_a_row >= limit else None
    threshold = episode.speedup_threshold
    if threshold is not None and verdict.timing_meaningful:
        if verdict.speedup is not None and verdict.speedup >= threshold:
            return STOP_SPEEDUP
        return None
    return STOP_CORRECT if episode.early_stop_on_correct else None


def feedback_of(verdict: Verdict) -> str:
    return verdict.feedback.strip() or f"{verdict.status.value}."


def turn_sampling(cfg: "KforgeConfig") -> SamplingParams:
    """Sampling for every turn. Without thinking the answer ends at </KERNEL>, so generation stops there;
    with thinking the tag may be mentioned while reasoning, so no stop string."""
    stop = [] if cfg.episode.thinking else [KERNEL_CLOSE]
    return sampling_from_config(cfg, stop=stop)


def request_seed(seed: int, problem_key: str, group: int, turn: int) -> int:
    """The sampling seed of one request: fixed by what the request is, not by when it was sent."""
    digest = hashlib.sha256(f"{seed}/{problem_key}/{group}/{turn}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


async def run_episode(
    problem: Problem,
    group: int,
    queue: GenerationQueue,
    builder: PromptBuilder,
    evaluate: EvaluateFn,
    cfg: "KforgeConfig",
    policy_version: int,
    seed: int,
    on_turn: OnTurn | None = None,
) -> Trajectory:
    """One trajectory: turns until a stop rule holds, `cfg.turns` is reached or the context is full."""
    traj = Trajectory(problem.key, group)
    history: list[Attempt] = []
    sampling = turn_sampling(cfg)
    failed_in_a_row = 0
    for t in range(cfg.turns):
        built = builder.build(problem, history, cfg.episode.context_budget_tokens)
        room = cfg.model.max_model_len - built.prompt_tokens
        if room < 1:
            traj.stop_reason = STOP_CONTEXT
            break
        params = replace(sampling, max_tokens=min(sampling.max_tokens, room),
                         seed=request_seed(seed, problem.key, group, t))
        completion = await queue.generate(GenerationRequest(built.ids, params, route=problem.key))
        cand = parse_response(completion.text, problem.key, builder.backend, cfg.episode.thinking)
        if cand.code is None:
            verdict = format_error_verdict(cand, cfg.episode.thinking)
        else:
            verdict = await evaluate(problem, cand.code, cand.backend)
        turn = Turn(
            index=t,
            prompt_ids=list(built.ids),
            response_ids=list(completion.token_ids),
            response_text=completion.text,
            logprobs=list(completion.logprobs),
            # The engine says which adapter sampled it: an adapter sync in the middle of an episode
            # (pipelined mode) must not leave later turns labelled with the old version.
            policy_version=completion.policy_version if completion.policy_version is not None else policy_version,
            candidate=cand,
            verdict=verdict,
            prompt_tokens=built.prompt_tokens,
            dropped_attempts=built.dropped_attempts,
            truncated=completion.finish_reason == "length",
        )
        traj.turns.append(turn)
        # The next prompt shows the code and the feedback; the thinking only with episode.keep_thinking.
        history.append(Attempt(code=cand.code, feedback=feedback_of(verdict), thinking=cand.thinking))
        failed_in_a_row = 0 if verdict.correct else failed_in_a_row + 1
        reason = stop_reason_after(verdict, cfg.episode, failed_in_a_row)
        if reason is None and t + 1 >= cfg.turns:
            reason = STOP_MAX_TURNS
        if reason is not None:
            traj.stop_reason = reason
        if on_turn is not None:
            on_turn(traj, turn)
        if reason is not None:
            break
    return traj


async def run_episodes(
    jobs: list[tuple[Problem, int]],
    backend: RolloutBackend,
    builder: PromptBuilder,
    evaluate: EvaluateFn,
    cfg: "KforgeConfig",
    policy_version: int,
    on_turn: OnTurn | None = None,
    seed: int | None = None,
) -> list[Trajectory]:
    """One trajectory per `(problem, group_index)` job, in job order; the chains run concurrently."""
    queue = GenerationQueue(backend)
    base_seed = cfg.dataset.seed if seed is None else seed
    chains = [asyncio.ensure_future(run_episode(p, g, queue, builder, evaluate, cfg, policy_version,
                                                base_seed, on_turn)) for p, g in jobs]
    try:
        return list(await asyncio.gather(*chains))
    except BaseException:
        for chain in chains:  # one failed chain ends the phase: no orphaned generations or evaluations
            chain.cancel()
        await asyncio.gather(*chains, return_exceptions=True)
        raise
