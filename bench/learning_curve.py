"""Is the learning caused by the reward? Three arms of kforge's own loop, step for step, and two tests.

Arms, run interleaved step by step (same problems, same sampling seeds, same start weights):
  real      the loop as it is (``--lr``)
  shuffled  the same learning rate, but within each step the advantages are permuted across the step's
            samples (across groups and within them) before the update: the updates are as large and as
            frequent as the real arm's, but no longer tied to the reward
  control   learning rate 0: the weights never move

Each step runs kforge's pieces: `run_episodes` (SmolLM2-135M-Instruct through the hf backend, sharing the
arm's learner weights; no vLLM), the sandboxed `EvalPool` (real evaluator; the Triton interpreter on a
CPU), `score_trajectories` / `assign_returns` / `build_samples` (kforge.credit) and `Learner.train_step` (LoRA).

Tests:
  paired    per step, real minus shuffled mean reward (the samples of one step share a policy and a
            problem, so the step is the unit, not the sample); one-sided paired t-test over the steps,
            effect size d_z = mean difference / sd of the differences. The same against the control.
  held out  after training, the real arm's adapter against the base model (the control arm's weights) on
            problems and seeds not used in training: the share of samples with a positive structure
            (format) score, one-sided Fisher exact test.

The reward (why it can move, and what it cannot show): SmolLM2-135M cannot write a correct Triton kernel
on a 2-core CPU, so correctness and speed never fire. ``format`` is the kernel structure the static
check verifies (kforge.credit.structure: a ModelNew with forward, a @triton.jit kernel, forward launching
it; 1/3 each, 0 for anything that does not parse or that the static check refuses), weight 1.0;
``compile`` 0.5 (it built and imported, with the full structure); correctness 1.0; flagged kernels score
0 rather than -1 (a 135M model's kernels call PyTorch, which the static check flags, and with -1 the
cheapest lesson is to stop answering). Constant strings earn nothing: ``<KERNEL>x</KERNEL>`` and the
prompt's skeleton (``def kernel(...)`` does not parse) score 0.

Output (``--out``): ``samples.jsonl`` (arm, step, problem, score, components, status), ``steps.jsonl``
(per arm and step: mean reward, format/compile/correct rates, learner metrics), ``heldout.json``,
``curve.png``. The last line printed is the paired test against the shuffled arm; exit 0 only when the
real arm beats the shuffled one at p < 0.05.

    nice -n 10 .venv/bin/python -m bench.learning_curve --minutes 28 --out /tmp/lc
    python -m bench.learning_curve --device cuda --minutes 10 --model /path/to/SmolLM2-135M-Instruct
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from pathlib import Path

ARMS = ("real", "shuffled", "control")
HELD_OUT_SEED = 1_000_003  # sampling seeds of the held-out test: never used by a training step


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.learning_curve", description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=28.0, help="budget of all arms and the held-out test")
    ap.add_argument("--heldout-minutes", type=float, default=4.0, help="part of --minutes kept for the held-out test")
    ap.add_argument("--steps", type=int, default=1000, help="at most this many steps per arm")
    ap.add_argument("--lr", type=float, default=2e-3, help="learning rate of the real and the shuffled arm")
    ap.add_argument("--group", type=int, default=4, help="samples per problem (the GRPO group)")
    ap.add_argument("--problems", type=int, default=2, help="problems per step")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--prompt", default="compact", help="dataset.prompt_option (compact: 375 prompt tokens)")
    ap.add_argument("--heldout-problems", type=int, default=4, help="level-1 problems never trained on")
    ap.add_argument("--heldout-group", type=int, default=8, help="held-out samples per problem and model")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu", help="cpu or cuda (learners; the evaluator then uses GPU 0)")
    ap.add_argument("--model", default=None, help="model.name override (a local HF folder on a GPU machine)")
    ap.add_argument("--out", default="/tmp/kforge-learning-curve")
    return ap.parse_args(argv)


def build_config(args: argparse.Namespace, lr: float):
    from kforge.config.loader import resolve

    overrides = [
        "episode.mode=single_turn",
        f"dataset.batch_size={args.problems}",
        f"dataset.group_size={args.group}",
        f"dataset.prompt_option={args.prompt}",
        f"rollout.max_tokens={args.max_tokens}",
        f"rollout.hf_batch_size={args.group * args.problems}",
        "reward.format_weight=1.0",
        "reward.compile_weight=0.5",
        "reward.correctness_weight=1.0",
        "reward.speed_weight=0.0",
        "reward.flagged_penalty=0.0",
        f"learner.learning_rate={lr}",
        "learner.warmup_steps=0",
        "learner.grad_clip=1.0",
        "lora.rank=8",
        "lora.alpha=16",
        "lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        f"dataset.seed={args.seed}",
        # 8 x ~500-token samples in one micro-batch keep ~10 GB of fp32 activations without it (an OOM kill seen)
        "model.gradient_checkpointing=true",
    ]
    if args.model:
        overrides += [f"model.name={args.model}", "model.gguf_file=null"]
    if args.device != "cpu":
        overrides += ["model.dtype=bfloat16"]
    return resolve("tiny", overrides=overrides).config


# ---------------------------------------------------------------------------------------------- statistics


def shuffle_advantages(samples: list, rng: random.Random) -> None:
    """The shuffled arm: the step's advantages permuted across its samples (same values, new owners)."""
    advantages = [s.advantage for s in samples]
    rng.shuffle(advantages)
    for sample, adv in zip(samples, advantages):
        sample.advantage = adv


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularised incomplete beta function (modified Lentz)."""
    tiny, qab, qap, qam = 1e-300, a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 300):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def t_sf(t: float, df: int) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom (no SciPy needed on a bare GPU machine)."""
    if t == 0.0:
        return 0.5
    x = df / (df + t * t)
    a, b = df / 2.0, 0.5
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    ibeta = front * _betacf(a, b, x) / a if x < (a + 1) / (a + b + 2) else 1.0 - front * _betacf(b, a, 1 - x) / b
    tail = 0.5 * ibeta  # P(|T| > |t|) / 2
    return tail if t >= 0 else 1.0 - tail


def paired_test(a: list[float], b: list[float]) -> dict[str, float]:
    """One-sided paired t-test of mean(a - b) > 0 over matched steps, and d_z = mean / sd of the differences.
    All differences equal: no spread, p is 0 when they are positive and 1 otherwise."""
    d = [x - y for x, y in zip(a, b)]
    n = len(d)
    mean = sum(d) / n if n else 0.0
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1)) if n > 1 else 0.0
    if n < 2 or sd == 0.0:
        return {"n": n, "mean_diff": mean, "sd": sd, "dz": float("inf") if mean > 0 else 0.0,
                "t": float("nan"), "p": 0.0 if mean > 0 and n > 1 else 1.0}
    t = mean / (sd / math.sqrt(n))
    return {"n": n, "mean_diff": mean, "sd": sd, "dz": mean / sd, "t": t, "p": t_sf(t, n - 1)}


def fisher_greater(hits_a: int, n_a: int, hits_b: int, n_b: int) -> float:
    """One-sided Fisher exact p that rate a exceeds rate b: P(a's hits >= observed) under the
    hypergeometric law with the margins fixed."""
    hits, total = hits_a + hits_b, n_a + n_b
    denom = math.comb(total, hits)
    return sum(math.comb(n_a, k) * math.comb(n_b, hits - k) for k in range(hits_a, min(n_a, hits) + 1)) / denom


def step_means(rows: list[dict], arm: str, key: str = "score") -> dict[int, float]:
    by_step: dict[int, list[float]] = {}
    for r in rows:
        if r["arm"] == arm:
            by_step.setdefault(r["step"], []).append(float(r[key]))
    return {s: sum(v) / len(v) for s, v in sorted(by_step.items())}


def describe(test: dict[str, float]) -> str:
    return (f"paired t-test over {test['n']} steps, mean difference {test['mean_diff']:+.3f}, "
            f"effect size d_z {test['dz']:.2f}, p = {test['p']:.4f}")


# ---------------------------------------------------------------------------------------------- the loop


class Arm:
    """One arm: its learner (own LoRA adapter and optimiser) and a backend sharing its weights."""

    def __init__(self, name: str, cfg, base_model, tokenizer, device: str, steps: int) -> None:
        import copy

        from kforge.learner.learner import Learner
        from kforge.rollout.base import sampling_from_config
        from kforge.rollout.hf import HFBackend

        self.name, self.cfg = name, cfg
        self.learner = Learner(cfg, device=device, model=copy.deepcopy(base_model), tokenizer=tokenizer,
                               total_steps=steps, sampling=sampling_from_config(cfg))
        self.backend = HFBackend.from_model(self.learner.model, tokenizer, batch_size=cfg.rollout.hf_batch_size)


def rollout(arm: Arm, jobs, builder, pool, seed: int):
    """The arm's episodes, then credit scores their turns (the episode only records verdicts)."""
    from kforge.credit.rewards import score_trajectories
    from kforge.policy.episode import run_episodes

    trajectories = asyncio.run(run_episodes(jobs, arm.backend, builder, pool.evaluate, arm.cfg,
                                            arm.learner.version, seed=seed))
    score_trajectories(trajectories, arm.cfg.reward, arm.cfg.episode.thinking)
    return trajectories


def turn_rows(arm: str, step: int, trajectories) -> list[dict]:
    rows = []
    for tr in trajectories:
        for turn in tr.turns:
            status = turn.verdict.status.value if turn.verdict else None
            rows.append({
                "arm": arm, "step": step, "problem": tr.problem_key, "group": tr.group_index, "score": turn.score,
                "status": status, "correct": float(status == "correct"),
                "response_tokens": len(turn.response_ids), **turn.reward_components,
            })
    return rows


def train_arm(arm: Arm, step: int, trajectories, seed: int) -> dict:
    from kforge.credit.advantages import assign_returns, build_samples

    assign_returns(trajectories, arm.cfg.episode.gamma)
    samples, adv = build_samples(trajectories, arm.cfg.learner, arm.cfg.reward)
    if arm.name == "shuffled":
        shuffle_advantages(samples, random.Random(seed * 7919 + step))
    metrics = arm.learner.train_step(samples) if samples else {"skipped": 1.0}
    return {"groups_kept": adv["groups_kept"], **{f"learner/{k}": v for k, v in metrics.items()}}


def held_out(arms: dict[str, Arm], problems, builder, pool, args) -> dict:
    """The real arm's adapter against the base model (the control arm never moved) on unseen problems/seeds."""
    jobs = [(p, g) for p in problems for g in range(args.heldout_group)]
    out = {"problems": [p.key for p in problems]}
    for name, arm in (("trained", arms["real"]), ("base", arms["control"])):
        rows = turn_rows(name, 0, rollout(arm, jobs, builder, pool, HELD_OUT_SEED + args.seed))
        out[name] = {"n": len(rows), "structure": sum(1 for r in rows if r["format"] > 0),
                     "full_structure": sum(1 for r in rows if r["format"] >= 1.0),
                     "compiled": sum(1 for r in rows if r["compile"] > 0),
                     "mean_reward": sum(r["score"] for r in rows) / max(len(rows), 1)}
    t, b = out["trained"], out["base"]
    out["fisher_p"] = fisher_greater(t["structure"], t["n"], b["structure"], b["n"])
    return out


def plot(rows: list[dict], out: Path, title: str) -> None:
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed: no curve.png")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for arm, style in zip(ARMS, ("o-", "s--", "x:")):
        reward, fmt = step_means(rows, arm), step_means(rows, arm, "format")
        if reward:
            ax1.plot(list(reward), list(reward.values()), style, label=arm)
            ax2.plot(list(fmt), list(fmt.values()), style, label=arm)
    ax1.set(xlabel="step", ylabel="mean reward", title=title)
    ax2.set(xlabel="step", ylabel="mean structure (format) score", title="kernel structure, 0..1")
    for ax in (ax1, ax2):
        ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    from kforge.evaluator import EvalPool
    from kforge.learner.lora import load_base
    from kforge.policy.prompts import PromptBuilder
    from kforge.problems import builtin_problems

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()
    cfgs = {"real": build_config(args, args.lr), "shuffled": build_config(args, args.lr), "control": build_config(args, 0.0)}
    cfg = cfgs["real"]
    level1 = [p for p in builtin_problems() if p.level == 1]
    # A fixed split: the held-out problems are never trained on.
    split = random.Random(args.seed).sample(level1, len(level1))
    test_problems, train_problems = split[:args.heldout_problems], split[args.heldout_problems:]
    base_model, tokenizer = load_base(cfg, args.device)
    arms = {name: Arm(name, cfgs[name], base_model, tokenizer, args.device, args.steps) for name in ARMS}
    del base_model
    builder = PromptBuilder.from_config(cfg, tokenizer)
    pool = EvalPool(cfg.evaluator, devices=[0] if args.device.startswith("cuda") else None)
    print(f"loaded in {time.time() - started:.0f}s on {args.device}; lr {args.lr:g}, {len(train_problems)} training "
          f"problems, {args.problems}x{args.group} samples per step and arm; held out: "
          f"{', '.join(p.key for p in test_problems)}; budget {args.minutes} min", flush=True)

    rows: list[dict] = []
    budget = (args.minutes - args.heldout_minutes) * 60.0
    last_round_s = 0.0
    print("step | reward real shuffled control | format real shuffled control | compile real | correct real | s",
          flush=True)
    with open(out / "samples.jsonl", "w") as samples_file, open(out / "steps.jsonl", "w") as steps_file:
        for step in range(1, args.steps + 1):
            if time.time() - started + last_round_s > budget:
                break
            r0 = time.time()
            seed = args.seed * 100_003 + step  # the same problems and sampling seeds in every arm
            batch = random.Random(seed).sample(train_problems, args.problems)
            jobs = [(p, g) for p in batch for g in range(args.group)]
            for name, arm in arms.items():
                s0 = time.time()
                trajectories = rollout(arm, jobs, builder, pool, seed)
                step_rows = turn_rows(name, step, trajectories)
                record = {"arm": name, "step": step, **{k: sum(r[k] for r in step_rows) / len(step_rows)
                                                        for k in ("score", "format", "compile", "correct")}}
                record.update(train_arm(arm, step, trajectories, args.seed), step_s=time.time() - s0)
                rows += step_rows
                for r in step_rows:
                    samples_file.write(json.dumps(r) + "\n")
                steps_file.write(json.dumps(record) + "\n")
            steps_file.flush()
            samples_file.flush()
            last_round_s = time.time() - r0
            m = {a: {k: step_means([r for r in rows if r["step"] == step], a, k)[step]
                     for k in ("score", "format", "compile", "correct")} for a in ARMS}
            print(f"{step:4d} | {m['real']['score']:.3f} {m['shuffled']['score']:.3f} {m['control']['score']:.3f} | "
                  f"{m['real']['format']:.2f} {m['shuffled']['format']:.2f} {m['control']['format']:.2f} | "
                  f"{m['real']['compile']:.2f} | {m['real']['correct']:.2f} | {last_round_s:.0f}", flush=True)
        if not rows:
            pool.close()
            print("learning: no step finished within the budget")
            return 1
        h0 = time.time()
        ho = held_out(arms, test_problems, builder, pool, args)
        ho["seconds"] = time.time() - h0
    pool.close()
    (out / "heldout.json").write_text(json.dumps(ho, indent=2) + "\n")
    plot(rows, out / "curve.png", f"SmolLM2-135M, {args.device}, lr {args.lr:g}")
    real, shuffled, control = (step_means(rows, a) for a in ARMS)
    steps = sorted(real)
    vs_control = paired_test([real[s] for s in steps], [control[s] for s in steps])
    vs_shuffled = paired_test([real[s] for s in steps], [shuffled[s] for s in steps])
    (out / "tests.json").write_text(json.dumps({"vs_shuffled": vs_shuffled, "vs_control": vs_control}, indent=2) + "\n")
    t, b = ho["trained"], ho["base"]
    print(f"{len(steps)} steps per arm, {len(rows)} samples in {(time.time() - started) / 60:.1f} min; files in {out}")
    print(f"mean reward per step: real {sum(real.values()) / len(steps):.3f}, shuffled "
          f"{sum(shuffled.values()) / len(steps):.3f}, control {sum(control.values()) / len(steps):.3f}")
    print(f"real vs control (lr 0): {describe(vs_control)}")
    print(f"held out ({', '.join(ho['problems'])}, unseen seeds): samples with kernel structure, trained "
          f"{t['structure']}/{t['n']} vs base {b['structure']}/{b['n']} (full structure {t['full_structure']} vs "
          f"{b['full_structure']}), one-sided Fisher exact p = {ho['fisher_p']:.4f}")
    print(f"learning: real vs shuffled advantages: {describe(vs_shuffled)}")
    return 0 if vs_shuffled["p"] < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
