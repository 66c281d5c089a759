#!/usr/bin/env python3
"""One GPU, everything on it: the stages of a training step with a 1.5B-shaped model, memory per role.

    python -m bench.one_gpu [--steps 3] [--prompts 64] [--prompt-tokens 1024] [--tokens 1024] [--gpu-mem 0.35]

Random-init weights with Qwen2.5-Coder-1.5B's shape (config, a small local tokenizer, safetensors; nothing is
downloaded). kforge's own parts on GPU 0, as a one-GPU `kforge train` places them: the vLLM worker
(VLLMBackend, sleep mode on) and the LoRA learner (LearnerProcess, rank 32). Each step: generate, sleep the
engine, train on the completions (random advantages: this measures cost, not learning), wake it, sync the
adapter. Prints per step the time of each stage, the engine's sleep and wake cost and the GPU memory each
role held at the end of each stage (NVML per process; the role is the process's KFORGE_ROLE, inherited by
vLLM's engine core), then each role's peak over the run (sampled every 0.1 s) and the base weights that the
engine and the learner each hold a copy of: what one shared copy would save.
The eval pool is not in it: its memory is the problem's inputs and outputs, not the model's.
Needs a GPU and vLLM (bench/device/prepare.sh).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path

from bench.gpu_busy import role_of

SHAPE = dict(arch="qwen2", hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab_size=151936,
             max_positions=32768)
GIB = 2**30


class RoleMemory:
    """GPU memory per KFORGE_ROLE, from NVML's per-process figures."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.roles: dict[int, str] = {}
        self.peaks: dict[str, int] = defaultdict(int)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def now(self) -> dict[str, int]:
        import psutil

        per_role: dict[str, int] = defaultdict(int)
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            per_role[role_of(psutil, p.pid, self.roles)] += int(p.usedGpuMemory or 0)
        per_role["all"] = sum(per_role.values())
        return per_role

    def _sample(self) -> None:
        while not self._stop.wait(0.1):
            for role, used in self.now().items():
                self.peaks[role] = max(self.peaks[role], used)

    def __enter__(self) -> "RoleMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def config(folder: Path, work: Path, args: argparse.Namespace):
    from kforge.config.schema import KforgeConfig

    cfg = KforgeConfig()
    cfg.model.name = str(folder)
    cfg.model.dtype = "bfloat16"
    cfg.model.max_model_len = args.prompt_tokens + args.tokens
    cfg.lora.rank, cfg.lora.alpha = 32, 64
    cfg.learner.loss_fn = "dr_grpo"
    cfg.learner.warmup_steps = 0
    cfg.rollout.max_tokens = args.tokens
    return cfg


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.one_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--tokens", type=int, default=1024, help="new tokens per completion (EOS ignored)")
    ap.add_argument("--gpu-mem", type=float, default=0.35, help="vLLM gpu_memory_utilization")
    ap.add_argument("--work", default=None)
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from bench.scratch_model import write_model_folder
    from kforge.credit.samples import Sample
    from kforge.rollout.base import GenerationRequest, SamplingParams
    from kforge.rollout.vllm_worker import VLLMBackend
    from kforge.train.learner_proc import LearnerProcess

    work = Path(args.work or tempfile.mkdtemp(prefix="kforge-one-gpu-"))
    t0 = time.time()
    folder = write_model_folder(work / "model", real_weights=True, **SHAPE)
    weights = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    print(f"1.5B-shaped model: {weights / GIB:.2f} GiB of bf16 weights, written in {time.time() - t0:.0f} s", flush=True)
    tok = AutoTokenizer.from_pretrained(str(folder))
    cfg = config(folder, work, args)
    engine_kwargs = dict(model=str(folder), dtype="bfloat16", gpu_memory_utilization=args.gpu_mem,
                         max_model_len=cfg.model.max_model_len, enable_prefix_caching=True, enable_lora=True,
                         max_lora_rank=32, max_loras=1, seed=0, logprobs_mode="processed_logprobs",
                         enable_sleep_mode=True)
    rng = random.Random(0)
    prompts = [[rng.randrange(100, len(tok)) for _ in range(args.prompt_tokens)] for _ in range(args.prompts)]
    rows: list[dict[str, float]] = []
    with RoleMemory() as mem:
        t = time.time()
        engine = VLLMBackend(tok, engine_kwargs, devices=[0], log_path=str(work / "vllm_worker.log"))
        start = {"engine start s": time.time() - t, "mem after engine start": mem.now()}
        t = time.time()
        # The learner scores tokens under what the engine samples with below.
        learner = LearnerProcess(cfg, [0], total_steps=args.steps,
                                 sampling=SamplingParams(max_tokens=args.tokens, temperature=1.0))
        start.update({"learner start s": time.time() - t, "mem after learner start": mem.now()})
        try:
            for step in range(args.steps):
                row: dict = {"step": step + 1}
                sampling = [SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=step * 1000 + i)
                            for i in range(len(prompts))]
                t = time.time()
                outs = engine.generate([GenerationRequest(p, s) for p, s in zip(prompts, sampling)])
                row["generate s"] = time.time() - t
                row["tokens"] = sum(len(o.token_ids) for o in outs)
                row["mem generate"] = mem.now()
                t = time.time()
                engine.sleep()
                row["sleep s"] = time.time() - t
                row["mem asleep"] = mem.now()
                samples = [Sample(p, o.token_ids, rng.gauss(0, 1), o.logprobs, learner.version)
                           for p, o in zip(prompts, outs)]
                t = time.time()
                learner.train_step(samples)
                row["learn s"] = time.time() - t
                row["mem learn"] = mem.now()
                t = time.time()
                engine.wake()
                row["wake s"] = time.time() - t
                t = time.time()
                adapter = work / f"adapter_{step + 1}"
                learner.save_adapter(str(adapter))
                engine.load_adapter(str(adapter), learner.version)
                row["sync s"] = time.time() - t
                row["mem synced"] = mem.now()
                rows.append(row)
                print(f"step {step + 1} done", flush=True)
        finally:
            learner.close()
            engine.close()
    print(f"\nengine start {start['engine start s']:.0f} s, learner start {start['learner start s']:.0f} s; "
          f"{args.prompts} prompts x {args.prompt_tokens} tokens, {args.tokens} new tokens each, LoRA rank 32")
    cols = ["generate s", "sleep s", "learn s", "wake s", "sync s"]
    print("\nstep | tokens | " + " | ".join(f"{c:>10}" for c in cols) + " | tok/s")
    for r in rows:
        print(f"{r['step']:>4} | {r['tokens']:>6} | " + " | ".join(f"{r[c]:>10.2f}" for c in cols)
              + f" | {r['tokens'] / r['generate s']:,.0f}")
    roles = sorted({k for r in rows for key in r if key.startswith("mem ") for k in r[key]} | set(mem.peaks))
    print("\nGPU GiB per role at the end of each stage (last step), and the peak over the run:")
    stages = [("after engine start", start["mem after engine start"]), ("after learner start", start["mem after learner start"])]
    stages += [(k[4:], rows[-1][k]) for k in ("mem generate", "mem asleep", "mem learn", "mem synced")] if rows else []
    print(f"{'stage':<20} | " + " | ".join(f"{r:>12}" for r in roles))
    for name, snap in stages + [("peak", mem.peaks)]:
        print(f"{name:<20} | " + " | ".join(f"{snap.get(r, 0) / GIB:>12.2f}" for r in roles))
    print(f"\nbase weights: {weights / GIB:.2f} GiB held by the engine and again by the learner; one shared copy "
          f"would save {weights / GIB:.2f} GiB ({weights / max(mem.peaks.get('all', 1), 1):.0%} of the peak of all roles)")
    return 0 if len(rows) == args.steps else 1


if __name__ == "__main__":
    raise SystemExit(main())
