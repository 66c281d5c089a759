"""`kforge sft`: supervised LoRA warm start on (problem, solution) pairs, the step before RL.

GRPO learns only from groups with mixed outcomes: a model that never writes a correct kernel gives it
nothing to learn from. A few epochs of cross-entropy on correct kernels raise that rate first (TritonForge
and AutoTriton fine-tune before RL; Dr. Kernel has a cold-start stage).

Everything a `kforge train` run would see is the same: the prompt of a pair is the first-turn prompt
`PromptBuilder.from_config` builds for the config (prompt option, backend, thinking, examples), the answer
is the form the parser reads (`format_answer`, behind an empty think section when the config asks for
one), and the update is the run's own `Learner` (its LoRA config and code) with `learner.loss_fn=nll` and
every advantage 1: the mean negative log-likelihood of the answer tokens. The result is a PEFT adapter
folder that `kforge train ... model.checkpoint=DIR` starts from and `kforge eval DIR` evaluates.

A pair of a problem the config holds out from training would put its answer into the weights that are
measured on it: such a set is refused. The default set (the built-in problems' reference solutions) leaves
those problems out instead.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from kforge.config.losses import SUPERVISED_LOSS
from kforge.config.schema import KforgeConfig
from kforge.errors import UserError
from kforge.problems.record import Problem

if TYPE_CHECKING:
    from kforge.credit.samples import Sample
    from kforge.learner.learner import Learner
    from kforge.policy.prompts import PromptBuilder

SFT_FILE = "sft.json"  # beside the adapter: what it was trained on and its losses


class SftError(UserError):
    """The warm start cannot run as asked; the message is one line for the user."""


@dataclass
class Pair:
    problem: Problem
    code: str
    where: str  # file:line, or "builtin"


@dataclass
class SftResult:
    epochs: list[dict[str, float]] = field(default_factory=list)  # per epoch: train_loss, heldout_loss, seconds
    train: list[str] = field(default_factory=list)  # problem keys
    heldout: list[str] = field(default_factory=list)
    skipped_long: int = 0


def _same_problem(a: Problem, b: Problem) -> bool:
    """One problem under two names: the same key of the same source, the same code, or the same name once
    the id prefix is dropped (the built-in "3_ReLU" and KernelBench's "19_ReLU")."""
    if a.source == b.source and a.key == b.key:
        return True
    if a.code.strip() == b.code.strip():
        return True
    bare = [(p.name.partition("_")[2] if p.name.partition("_")[0].isdigit() else p.name).lower() for p in (a, b)]
    return bare[0] == bare[1]


def held_out_problems(cfg: KforgeConfig) -> list[Problem]:
    """The problems `kforge train` with this config would hold out (its split, drawn as train draws it)."""
    from kforge.problems import ProblemSourceError, problems_from_config, split_problems

    try:
        return split_problems(problems_from_config(cfg.dataset), cfg.dataset.test_fraction, cfg.dataset.seed)[1]
    except ProblemSourceError as exc:
        raise SftError(f"cannot draw the config's held-out problems to keep them out of the warm start: {exc}") from None


def default_pairs(held_out: list[Problem]) -> tuple[list[Pair], list[Problem]]:
    """(the built-in problems' reference solutions, the ones left out because the config holds them out)."""
    from kforge.problems import builtin_problems

    pairs, left_out = [], []
    for problem in builtin_problems():
        if not problem.solution:
            continue
        if any(_same_problem(problem, h) for h in held_out):
            left_out.append(problem)
        else:
            pairs.append(Pair(problem, problem.solution, "builtin"))
    return pairs, left_out


def read_pairs(path: Path, cfg: KforgeConfig) -> list[Pair]:
    """Pairs from a JSONL of {"problem": KEY or "prompt": TEXT, "code": SOLUTION}. A KEY names a problem of the
    config's source (any level); a TEXT is the architecture itself (a module defining `Model`, as a problem's
    code is shown in the prompt)."""
    from kforge.jsonl import iter_objects
    from kforge.problems import ProblemSourceError, find_problem, load_problems

    if not path.is_file():
        raise SftError(f"--data {path}: no such file; give a JSONL of {{\"problem\": KEY, \"code\": SOLUTION}} lines")
    known: list[Problem] | None = None
    pairs = []
    for where, lineno, row in iter_objects(path, SftError, 'a JSON object {"problem" or "prompt", "code"}'):
        code = row.get("code")
        if not isinstance(code, str) or not code.strip():
            raise SftError(f"{where}: no \"code\" (the solution's source) on this line")
        if isinstance(row.get("problem"), str):
            if known is None:
                try:
                    known = load_problems(cfg.dataset.source, None)
                except ProblemSourceError as exc:
                    raise SftError(f"{where}: cannot read dataset.source to find its problem: {exc}") from None
            try:
                problem = find_problem(known, row["problem"])
            except ProblemSourceError as exc:
                raise SftError(f"{where}: {exc}") from None
        elif isinstance(row.get("prompt"), str) and row["prompt"].strip():
            problem = Problem(level=0, problem_id=lineno, name=f"sft_{lineno}", code=row["prompt"], source=f"sft:{path}")
        else:
            raise SftError(f"{where}: give \"problem\" (a LEVEL/ID key or name) or \"prompt\" (the architecture)")
        pairs.append(Pair(problem, code, where))
    if not pairs:
        raise SftError(f"--data {path}: no pairs in it")
    return pairs


def only(pairs: list[Pair], spec: str | None) -> list[Pair]:
    """The pairs of the problems `spec` names (--problems: comma-separated keys or names); all when None."""
    from kforge.problems import ProblemSourceError, select_problems

    if not spec:
        return pairs
    names = [s.strip() for s in spec.split(",") if s.strip()]
    try:
        chosen = {p.key for p in select_problems([p.problem for p in pairs], names=names)}
    except ProblemSourceError as exc:
        raise SftError(f"--problems: {exc}") from None
    return [p for p in pairs if p.problem.key in chosen]


def refuse_leaks(pairs: list[Pair], held_out: list[Problem], cfg: KforgeConfig) -> None:
    for pair in pairs:
        for h in held_out:
            if _same_problem(pair.problem, h):
                raise SftError(f"{pair.where}: a solution of {h.key} {h.name}, which this config holds out from "
                               f"training (dataset.test_fraction {cfg.dataset.test_fraction}, seed {cfg.dataset.seed}); "
                               "remove it from the set, or change the split")


def split_pairs(pairs: list[Pair], fraction: float, seed: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held out): a pair's side comes from a hash of (seed, problem), so a problem's pairs stay together."""
    if fraction <= 0:
        return pairs, []
    keys = sorted({f"{p.problem.source}|{p.problem.key}" for p in pairs},
                  key=lambda k: hashlib.sha256(f"{seed}|{k}".encode()).hexdigest())
    n = min(len(keys) - 1, max(1, round(len(keys) * fraction)))
    if n < 1:
        raise SftError(f"--holdout {fraction}: the set holds one problem; a held-out loss needs two or more")
    out = set(keys[:n])
    return ([p for p in pairs if f"{p.problem.source}|{p.problem.key}" not in out],
            [p for p in pairs if f"{p.problem.source}|{p.problem.key}" in out])


def sft_config(cfg: KforgeConfig, learning_rate: float | None) -> KforgeConfig:
    """The run's config with the learner turned to supervised steps: the mean negative log-likelihood of the
    answer tokens, one optimiser step per batch, no KL or entropy terms (nothing to stay near), no
    importance ratios (there is no sampler)."""
    out = cfg.model_copy(deep=True)
    lc = out.learner
    lc.loss_fn, lc.loss_aggregation, lc.num_substeps = SUPERVISED_LOSS, "token_mean", 1
    lc.kl_coef, lc.entropy_coef, lc.shuffle_advantages = 0.0, 0.0, False
    lc.mismatch_reject_ratio = lc.mismatch_token_veto = None
    if learning_rate is not None:
        lc.learning_rate = learning_rate
    return out


def answer_text(code: str, thinking: bool) -> str:
    from kforge.policy.prompts import THINK_CLOSE, THINK_OPEN, format_answer

    return (f"{THINK_OPEN}\n{THINK_CLOSE}\n" if thinking else "") + format_answer(code)


def to_samples(pairs: list[Pair], builder: PromptBuilder, cfg: KforgeConfig, eos: int | None) -> tuple[list[Sample], int]:
    """(one learner Sample per pair that fits model.max_model_len, how many did not fit)."""
    from kforge.credit.samples import Sample

    samples, skipped = [], 0
    for pair in pairs:
        prompt = builder.build(pair.problem, [], cfg.episode.context_budget_tokens).ids
        answer = builder.encode(answer_text(pair.code, cfg.episode.thinking)) + ([eos] if eos is not None else [])
        if len(prompt) + len(answer) > cfg.model.max_model_len:
            skipped += 1
            continue
        samples.append(Sample(list(prompt), answer, 1.0, problem_key=pair.problem.key))
    return samples, skipped


def mean_nll(learner: Learner, samples: list[Sample]) -> float:
    """Mean negative log-likelihood per answer token under the learner's current weights (no update), through the
    learner's own log-prob path: its micro-batch plan, packing, chunked log-probs and autocast, as in its step."""
    import torch

    from kforge.learner.packing import collate_any, plan

    total, tokens = 0.0, 0
    learner.model.eval()
    with torch.no_grad():
        for indices in plan([s.num_tokens for s in samples], learner.cfg.learner.micro_batch_tokens, learner.pack):
            batch = collate_any(samples, indices, learner.pad_id, learner.device, learner.pack)
            logp, _ = learner.logprobs(batch)
            total -= float(torch.where(batch.response_mask, logp, torch.zeros_like(logp)).sum().item())
            tokens += int(batch.response_mask.sum().item())
    return total / max(tokens, 1)


def run_sft(cfg: KforgeConfig, train: list[Pair], heldout: list[Pair], out: Path, epochs: int, batch_size: int,
            on_progress: Callable[[str, int, int], None] = lambda *_: None,
            say: Callable[[str], None] = print) -> SftResult:
    """Train the adapter and write it to `out` (a PEFT folder plus `sft.json`)."""
    import torch

    from kforge.learner.learner import Learner
    from kforge.policy.prompts import PromptBuilder
    from kforge.rag import retriever_for
    from kforge.rollout.base import SamplingParams
    from kforge.train.trainer import seed_everything

    seed_everything(cfg.dataset.seed)
    steps = epochs * math.ceil(len(train) / batch_size)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    say(f"loading {cfg.model.name} ({device})")
    # Temperature 1, no truncation: the loss is the model's own likelihood of the answer.
    learner = Learner(cfg, device=device, total_steps=steps, sampling=SamplingParams(cfg.rollout.max_tokens, 1.0, 1.0, -1))
    builder = PromptBuilder.from_config(cfg, learner.tokenizer, retriever=retriever_for(cfg.dataset))
    eos = learner.tokenizer.eos_token_id
    train_samples, skipped = to_samples(train, builder, cfg, eos)
    heldout_samples, skipped_h = to_samples(heldout, builder, cfg, eos)
    if skipped + skipped_h:
        say(f"left out {skipped + skipped_h} pairs longer than model.max_model_len {cfg.model.max_model_len}")
    if not train_samples:
        raise SftError("no training pair fits model.max_model_len; raise it or give shorter solutions")
    result = SftResult(train=sorted({p.problem.key for p in train}), heldout=sorted({p.problem.key for p in heldout}),
                       skipped_long=skipped + skipped_h)
    rng = random.Random(cfg.dataset.seed)
    done = 0
    for epoch in range(1, epochs + 1):
        t0 = time.time()
        order = list(range(len(train_samples)))
        rng.shuffle(order)
        losses = []
        for start in range(0, len(order), batch_size):
            batch = [train_samples[i] for i in order[start:start + batch_size]]
            metrics = learner.train_step(batch)
            losses.append((metrics["loss"], len(batch)))
            done += 1
            on_progress(f"epoch {epoch}/{epochs}", done, steps)
        row = {"epoch": float(epoch), "train_loss": sum(loss * n for loss, n in losses) / sum(n for _, n in losses),
               "seconds": time.time() - t0}
        if heldout_samples:
            row["heldout_loss"] = mean_nll(learner, heldout_samples)
        result.epochs.append(row)
        say(f"epoch {epoch}/{epochs}: train loss {row['train_loss']:.4f}"
            + (f", held-out loss {row['heldout_loss']:.4f}" if "heldout_loss" in row else ""))
    learner.save_adapter(out)
    record = {"model": cfg.model.name, "preset": cfg.preset, "lora": cfg.lora.model_dump(),
              "learning_rate": cfg.learner.learning_rate, "epochs": result.epochs, "train_problems": result.train,
              "heldout_problems": result.heldout, "pairs_too_long": result.skipped_long}
    (out / SFT_FILE).write_text(json.dumps(record, indent=1) + "\n")
    return result
