#!/usr/bin/env python
"""The data-parallel learner on GPUs: one rank against N (NCCL), same batch, same start.

Prints per rank count the train_step wall time, tokens/s and peak memory of rank 0, and the largest
difference of the updated adapter against one rank (it must be at bf16/fp32 rounding level: the update is
the same for any rank count). Random-init models with the real shapes of bench/learner.py's ARCHS.

    python -m bench.learner_ddp --gpus 2 --arch 1.5b          # 1 vs 2 ranks
    python -m bench.learner_ddp --gpus 4 --arch 7b --seq 4096
    python -m bench.learner_ddp --smoke                         # CPU, gloo, tiny model: checks this script
"""

from __future__ import annotations

import argparse
import os
import random
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from kforge.config.schema import KforgeConfig  # noqa: E402
from kforge.credit.samples import Sample  # noqa: E402
from kforge.rollout.base import SamplingParams  # noqa: E402
from kforge.train.learner_proc import LearnerProcess, LearnerService  # noqa: E402


class BenchLearner(LearnerService):
    """The real learner service on a random-init model of `arch` (same seed on every rank)."""

    def __init__(self, arch: str = "smoke", **run) -> None:
        self.arch = arch
        super().__init__(**run)

    def base_model(self, cfg, device):
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        from bench.learner import ARCHS

        torch.manual_seed(0)
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        with torch.device(device):
            model = Qwen2ForCausalLM(Qwen2Config(**ARCHS[self.arch])).to(dtype)
        return model, None

    def probe(self):
        import torch

        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        flat = torch.cat([p.detach().float().reshape(-1).cpu() for p in self.learner.params])
        return flat, peak


def batch(n: int, seq: int, vocab: int, seed: int) -> list[Sample]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        length = rng.randint(seq // 4, seq)
        prompt = [rng.randrange(3, vocab) for _ in range(length // 2)]
        response = [rng.randrange(3, vocab) for _ in range(length - len(prompt))]
        out.append(Sample(prompt, response, rng.uniform(-1, 1), problem_key=f"p{i % 4}"))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.learner_ddp")
    ap.add_argument("--gpus", type=int, default=2)
    ap.add_argument("--arch", default="1.5b")
    ap.add_argument("--seq", type=int, default=4096, help="longest sequence (prompt + response)")
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--smoke", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.gpus, args.arch, args.seq, args.samples, args.steps = 2, "smoke", 64, 8, 2
    from bench.learner import ARCHS

    cfg = KforgeConfig()
    cfg.model.gradient_checkpointing = True
    cfg.lora.rank, cfg.lora.alpha, cfg.lora.dropout = 32, 64, 0.0
    cfg.rollout.max_tokens = args.seq
    cfg.learner.learning_rate, cfg.learner.micro_batch_tokens, cfg.learner.call_timeout_s = 1e-4, 16384, 1800
    samples = batch(args.samples, args.seq, ARCHS[args.arch]["vocab_size"], 0)
    tokens = sum(s.num_tokens for s in samples)
    reference = None
    print(f"arch {args.arch}, {args.samples} samples, {tokens} tokens per step, {args.steps} steps")
    print(f"{'ranks':>5} {'step s':>8} {'tokens/s':>10} {'peak GiB':>9} {'max |dW| vs 1 rank':>20}")
    for world in sorted({1, args.gpus}):
        devices = [] if args.smoke else list(range(world))
        proc = LearnerProcess(cfg, devices, total_steps=args.steps, sampling=SamplingParams(max_tokens=args.seq),
                              factory="bench.learner_ddp:BenchLearner",
                              factory_kwargs={"arch": args.arch}, cpu_ranks=world, start_timeout_s=1800)
        try:
            times = []
            for _ in range(args.steps):
                t0 = time.perf_counter()
                proc.train_step(samples)
                times.append(time.perf_counter() - t0)
            flat, peak = proc._procs[0].call("probe", timeout_s=600)
        finally:
            proc.close()
        step = sorted(times[1:] or times)[len(times[1:] or times) // 2]
        diff = ("" if reference is None
                else f"{float((flat - reference).abs().max()):.3g} (|W| max {float(reference.abs().max()):.3g})")
        reference = flat if reference is None else reference
        print(f"{world:>5} {step:>8.2f} {tokens / step:>10.0f} {peak:>9.1f} {diff:>20}")


if __name__ == "__main__":
    main()
