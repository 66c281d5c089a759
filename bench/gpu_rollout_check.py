#!/usr/bin/env python3
"""GPU check of kforge's rollout backends, offline, on a randomly initialised model of a real architecture.

  python -m bench.gpu_rollout_check [--quick] [--work DIR] [--json FILE] [--skip-hf] [--skip-vllm]

HF backend: batched generation, log-probs against a forward pass, LoRA hot-load changing outputs,
sleep/wake. vLLM backend (when vLLM imports): generation, log-probs against the HF forward pass (fp32)
without and with a LoRA, hot-load of PEFT-written adapters (outputs change; reloading an earlier
adapter gives its outputs back, so no stale prefix cache is used), sleep/wake with the GPU memory it frees.
Prints one table; exit status 1 when a check fails. With vLLM 0.23 from ../shared/device (bench/device/prepare.sh):
`export PYTHONPATH=/tmp/site:. VLLM_USE_FLASHINFER_SAMPLER=0`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path

for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                   "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(key, value)

ROWS: list[dict] = []


def record(check: str, ok: bool | None, detail: str, **numbers) -> None:
    ROWS.append({"check": check, "ok": ok, "detail": detail, **numbers})
    mark = "PASS" if ok else ("FAIL" if ok is False else "info")
    print(f"[{mark}] {check}: {detail}", flush=True)


def guarded(name: str):
    def wrap(fn):
        def run(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:  # one failing section must not hide the others
                record(name, False, f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                traceback.print_exc()
                return None
        return run
    return wrap


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
        return int(out.split()[0])
    except Exception:
        return None


def prompts_for(tok, n: int) -> list[list[int]]:
    texts = [f"Write a Triton kernel for operator number {i}: a fused softmax over rows of width {64 * (i % 7 + 1)}."
             for i in range(n)]
    return [tok(tok.apply_chat_template([{"role": "user", "content": t}], tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"] for t in texts]


def forward_logprobs(model, prompt, tokens, temperature):
    """log p(tokens) from one unpadded fp32 forward pass (the learner's view)."""
    import torch

    from kforge.rollout.logprobs import sampled_logprobs

    device = next(model.parameters()).device
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens], device=device)).logits[0, len(prompt) - 1: -1]
    return sampled_logprobs(logits.float().cpu(), torch.tensor(tokens), temperature)


def diff_stats(got, expected) -> tuple[float, float]:
    import torch

    d = (torch.tensor(got) - expected).abs()
    return float(d.max()), float(d.mean())


# ----------------------------------------------------------------------------------------- HF backend
@guarded("hf")
def check_hf(folder: Path, adapters: list[Path], args) -> None:
    import torch

    from kforge.modelio import ModelRef, load_causal_lm, load_tokenizer
    from kforge.rollout.base import GenerationRequest, SamplingParams
    from kforge.rollout.hf import HFBackend

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    ref = ModelRef(str(folder))
    tok = load_tokenizer(ref)
    model = load_causal_lm(ref, "float32", device)
    model.eval()
    backend = HFBackend(model, tok, batch_size=args.hf_batch, device=device)
    prompts = prompts_for(tok, args.prompts)
    params = SamplingParams(max_tokens=args.tokens, temperature=0.8, seed=0)
    backend.generate([GenerationRequest(prompts[0], SamplingParams(max_tokens=4))])  # warm-up
    t0 = time.perf_counter()
    outs = backend.generate([GenerationRequest(p, params) for p in prompts])
    dt = time.perf_counter() - t0
    n = sum(len(o.token_ids) for o in outs)
    record("hf.generate", all(o.token_ids for o in outs), f"{len(outs)} prompts, {n} tokens, {n / dt:.0f} tok/s on {device}",
           tok_per_s=n / dt)
    worst = 0.0
    for p, o in list(zip(prompts, outs))[:4]:
        worst = max(worst, diff_stats(o.logprobs, forward_logprobs(model, p, o.token_ids, 0.8))[0])
    record("hf.logprobs_vs_forward", worst < 1e-3, f"max |diff| {worst:.2e} (fp32, target < 1e-3)", max_abs=worst)

    greedy = [GenerationRequest(p, SamplingParams(max_tokens=16, temperature=0.0)) for p in prompts[:4]]
    base = [o.token_ids for o in backend.generate(greedy)]
    backend.load_adapter(str(adapters[0]), 1)
    tuned = [o.token_ids for o in backend.generate(greedy)]
    record("hf.lora_changes_greedy", tuned != base, f"{sum(a != b for a, b in zip(tuned, base))}/4 prompts changed")
    backend.unload_adapter()

    if device.startswith("cuda"):
        before = torch.cuda.memory_allocated()
        backend.sleep()
        asleep = torch.cuda.memory_allocated()
        backend.wake()
        again = [o.token_ids for o in backend.generate(greedy)]
        record("hf.sleep_wake", asleep < before and again == base,
               f"allocated {before / 2**20:.0f} -> {asleep / 2**20:.0f} MiB asleep; same greedy output after wake")
    backend.close()
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


# --------------------------------------------------------------------------------------- vLLM backend
@guarded("vllm")
def check_vllm(folder: Path, adapters: list[Path], args) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from kforge.modelio import ModelRef, load_tokenizer
    from kforge.rollout.base import GenerationRequest, SamplingParams
    from kforge.rollout.vllm_worker import VLLMBackend

    tok = load_tokenizer(ModelRef(str(folder)))
    engine_kwargs = dict(
        model=str(folder), dtype=args.vllm_dtype, gpu_memory_utilization=args.gpu_mem, max_model_len=2048,
        enforce_eager=args.quick, enable_prefix_caching=True, enable_sleep_mode=True, enable_lora=True,
        max_lora_rank=16, max_loras=1, seed=0, logprobs_mode="processed_logprobs",
    )
    log = Path(args.work) / "vllm_worker.log"
    t0 = time.perf_counter()
    backend = VLLMBackend(tok, engine_kwargs, devices=[0], log_path=str(log))
    record("vllm.start", True, f"worker ready in {time.perf_counter() - t0:.0f} s (pid {backend.info['pid']}, log {log})")
    try:
        prompts = prompts_for(tok, args.prompts)
        params = SamplingParams(max_tokens=args.tokens, temperature=0.8, seed=0)
        backend.generate([GenerationRequest(prompts[0], SamplingParams(max_tokens=4))])
        t0 = time.perf_counter()
        outs = backend.generate([GenerationRequest(p, SamplingParams(**{**params.__dict__, "seed": i}))
                                 for i, p in enumerate(prompts)])
        dt = time.perf_counter() - t0
        n = sum(len(o.token_ids) for o in outs)
        ok = all(len(o.token_ids) == len(o.logprobs) > 0 for o in outs)
        record("vllm.generate", ok, f"{len(outs)} prompts, {n} tokens, {n / dt:.0f} tok/s", tok_per_s=n / dt)

        hf = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).cuda().eval()
        stats = [diff_stats(o.logprobs, forward_logprobs(hf, p, o.token_ids, 0.8)) for p, o in list(zip(prompts, outs))[:8]]
        worst, mean = max(s[0] for s in stats), sum(s[1] for s in stats) / len(stats)
        tol = 1e-3 if args.vllm_dtype == "float32" else 0.1
        record("vllm.logprobs_vs_hf_forward", worst < tol,
               f"max |diff| {worst:.3e}, mean {mean:.3e} ({args.vllm_dtype} engine vs fp32 HF; target max < {tol})",
               max_abs=worst, mean_abs=mean)

        greedy = [GenerationRequest(p, SamplingParams(max_tokens=16, temperature=0.0)) for p in prompts[:8]]
        base = [o.token_ids for o in backend.generate(greedy)]
        t0 = time.perf_counter()
        backend.load_adapter(str(adapters[0]), 1)
        load_s = time.perf_counter() - t0
        first = backend.generate(greedy)
        changed = sum(a.token_ids != b for a, b in zip(first, base))
        record("vllm.lora_hot_load", changed > 0, f"load {load_s:.1f} s; greedy output changed on {changed}/8 prompts")
        peft = PeftModel.from_pretrained(hf, str(adapters[0])).eval()
        stats = [diff_stats(o.logprobs, forward_logprobs(peft, p, o.token_ids, 1.0)) for p, o in zip(prompts[:8], first)]
        worst = max(s[0] for s in stats)
        record("vllm.lora_logprobs_vs_peft_forward", worst < tol, f"max |diff| {worst:.3e} (target < {tol})", max_abs=worst)

        backend.load_adapter(str(adapters[1]), 2)
        second = [o.token_ids for o in backend.generate(greedy)]
        backend.load_adapter(str(adapters[0]), 3)
        back = [o.token_ids for o in backend.generate(greedy)]
        record("vllm.lora_versions", second != [o.token_ids for o in first] and back == [o.token_ids for o in first],
               "adapter 2 changes outputs; reloading adapter 1 (new id) gives its outputs back")

        used = gpu_used_mib()
        t0 = time.perf_counter()
        backend.sleep()
        sleep_s = time.perf_counter() - t0
        asleep = gpu_used_mib()
        t0 = time.perf_counter()
        backend.wake()
        wake_s = time.perf_counter() - t0
        woken = gpu_used_mib()
        after = [o.token_ids for o in backend.generate(greedy)]
        freed = used is not None and asleep is not None and asleep < used
        record("vllm.sleep_wake", freed and after == back,
               f"GPU used {used} -> {asleep} -> {woken} MiB; sleep {sleep_s:.2f} s, wake {wake_s:.2f} s; same outputs after wake")
    finally:
        backend.close()


def print_table() -> None:
    width = max(len(r["check"]) for r in ROWS) if ROWS else 10
    print("\n" + "=" * (width + 90))
    print(f"{'check':<{width}}  result  detail")
    print("-" * (width + 90))
    for r in ROWS:
        mark = "PASS" if r["ok"] else ("FAIL" if r["ok"] is False else "info")
        print(f"{r['check']:<{width}}  {mark:<6}  {r['detail']}")
    print("=" * (width + 90), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.gpu_rollout_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small model, eager vLLM, fewer prompts")
    p.add_argument("--work", default="/tmp/kforge-gpu-check")
    p.add_argument("--json", default="")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--skip-vllm", action="store_true")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--hf-batch", type=int, default=8)
    p.add_argument("--gpu-mem", type=float, default=0.35)
    p.add_argument("--vllm-dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args()
    args.prompts = args.prompts or (8 if args.quick else 32)
    args.tokens = args.tokens or (32 if args.quick else 128)

    import torch

    from bench.scratch_model import write_lora, write_model_folder

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    shape = dict(hidden=256, layers=2, heads=4, kv_heads=4, intermediate=768) if args.quick else \
        dict(hidden=1024, layers=8, heads=16, kv_heads=8, intermediate=2816)
    folder = write_model_folder(work / "model", vocab_size=8000, real_weights=True, dtype="bfloat16", **shape)
    adapters = [write_lora(folder, work / f"lora{s}", rank=16, seed=s) for s in (1, 2)]
    record("setup", True, f"random-init Llama {shape} + 2 PEFT adapters in {time.perf_counter() - t0:.0f} s "
                          f"(torch {torch.__version__}, "
                          f"GPU: {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'})")
    if not args.skip_hf:
        check_hf(folder, adapters, args)
    if not args.skip_vllm:
        try:
            import vllm

            record("vllm.import", True, f"vLLM {vllm.__version__}")
        except Exception as exc:
            record("vllm.import", False, f"vLLM does not import ({type(exc).__name__}: {exc}); vLLM checks skipped")
        else:
            if not torch.cuda.is_available():
                record("vllm", False, "no CUDA GPU: vLLM checks skipped")
            else:
                check_vllm(folder, adapters, args)
    print_table()
    if args.json:
        Path(args.json).write_text(json.dumps(ROWS, indent=1))
    return 0 if all(r["ok"] is not False for r in ROWS) else 1


if __name__ == "__main__":
    sys.exit(main())
