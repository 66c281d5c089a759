"""Multi-turn episodes: generate, parse, evaluate, score, feed the verdict back, stop or refine.

Turn t of every active trajectory is generated as one batch; each completion is parsed and submitted to
the evaluator as soon as it is ready (evaluations overlap each other and, with backends that finish in
sub-batches, the rest of the generation). Responses without a readable kernel get a format-error verdict
here and never reach the evaluator. This module knows the evaluator only as an async function.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Awaitable, Callable

from kforge.evaluator.verdict import Verdict
from kforge.policy.parsing import format_error_verdict, parse_response
from kforge.policy.prompts import KERNEL_CLOSE, Attempt, PromptBuilder
from kforge.policy.records import Candidate, Trajectory, Turn
from kforge.problems.record import Problem
from kforge.rollout.base import Completion, GenerationRequest, RolloutBackend, SamplingParams, sampling_from_config

if TYPE_CHECKING:
    from kforge.config.schema import EpisodeConfig, KforgeConfig

EvaluateFn = Callable[[Problem, str, str], Awaitable[Verdict]]  # (problem, code, backend) -> verdict
ScoreFn = Callable[[Turn, Trajectory], "tuple[float, dict[str, float]]"]
OnTurn = Callable[[Trajectory, Turn], None]

STOP_CORRECT = "correct"
STOP_SPEEDUP = "speedup_reached"
STOP_MAX_TURNS = "max_turns"
STOP_CONTEXT = "context_full"  # the prompt alone fills model.max_model_len


def stop_reason_after(verdict: Verdict, episode: "EpisodeConfig") -> str | None:
    """Why a trajectory stops after a turn with this verdict, or None to refine further.

    With `speedup_threshold` set, a correct kernel is refined until its measured speedup reaches it; where
    timing is not meaningful (CPU, Triton interpreter) the threshold cannot be judged and
    `early_stop_on_correct` decides instead."""
    if not verdict.correct:
        return None
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


@dataclass
class _Episode:
    problem: Problem
    trajectory: Trajectory
    history: list[Attempt] = field(default_factory=list)


async def run_episodes(
    jobs: list[tuple[Problem, int]],
    backend: RolloutBackend,
    builder: PromptBuilder,
    evaluate: EvaluateFn,
    score: ScoreFn,
    cfg: "KforgeConfig",
    policy_version: int,
    on_turn: OnTurn | None = None,
) -> list[Trajectory]:
    """One trajectory per `(problem, group_index)` job, in job order."""
    episodes = [_Episode(problem, Trajectory(problem.key, group)) for problem, group in jobs]
    sampling = turn_sampling(cfg)
    thinking = cfg.episode.thinking
    max_len = cfg.model.max_model_len
    active = list(episodes)
    for t in range(cfg.turns):
        if not active:
            break
        runnable: list[tuple[_Episode, list[int], int, int]] = []  # (episode, prompt ids, dropped, max tokens)
        for ep in active:
            built = builder.build(ep.problem, ep.history, cfg.episode.context_budget_tokens)
            room = max_len - built.prompt_tokens
            if room < 1:
                ep.trajectory.stop_reason = STOP_CONTEXT
                continue
            runnable.append((ep, built.ids, built.dropped_attempts, min(sampling.max_tokens, room)))
        requests = [
            GenerationRequest(ids, replace(sampling, max_tokens=n))
            for _, ids, _, n in runnable
        ]
        pending: dict[int, tuple[Candidate, "asyncio.Future[Verdict]"]] = {}

        def submit(i: int, completion: Completion) -> None:
            if i in pending:
                return
            ep = runnable[i][0]
            cand = parse_response(completion.text, ep.problem.key, builder.backend, thinking)
            if cand.code is None:
                fut: asyncio.Future[Verdict] = asyncio.get_running_loop().create_future()
                fut.set_result(format_error_verdict(cand, thinking))
            else:
                fut = asyncio.ensure_future(evaluate(ep.problem, cand.code, cand.backend))
            pending[i] = (cand, fut)

        completions = await backend.agenerate(requests, submit) if requests else []
        for i, completion in enumerate(completions):  # backends that finished without calling back
            submit(i, completion)
        results = await asyncio.gather(*(pending[i][1] for i in range(len(completions))), return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException):
                raise res

        still_active = []
        for i, ((ep, ids, dropped, _), completion, verdict) in enumerate(zip(runnable, completions, results)):
            assert isinstance(verdict, Verdict)
            turn = Turn(
                index=t,
                prompt_ids=list(ids),
                response_ids=list(completion.token_ids),
                response_text=completion.text,
                logprobs=list(completion.logprobs),
                policy_version=policy_version,
                candidate=pending[i][0],
                verdict=verdict,
                prompt_tokens=len(ids),
                dropped_attempts=dropped,
            )
            ep.trajectory.turns.append(turn)
            turn.score, turn.reward_components = score(turn, ep.trajectory)
            # The next prompt shows the code and the feedback; the thinking of earlier turns is dropped.
            ep.history.append(Attempt(code=turn.candidate.code if turn.candidate else None, feedback=feedback_of(verdict)))
            reason = stop_reason_after(verdict, cfg.episode)
            if reason is not None:
                ep.trajectory.stop_reason = reason
            elif t + 1 >= cfg.turns:
                ep.trajectory.stop_reason = STOP_MAX_TURNS
            else:
                still_active.append(ep)
            if on_turn is not None:
                on_turn(ep.trajectory, turn)
        active = still_active
    return [ep.trajectory for ep in episodes]
