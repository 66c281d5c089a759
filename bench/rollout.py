#!/usr/bin/env python3
"""Rollout throughput: kforge's backend against a direct call of the same engine, same GPU, same prompts,
same sampling settings (per-request seeds included), offline, on a random-init model of a real architecture.

  python -m bench.rollout [--quick] [--backend vllm|hf|both] [--shape tiny|1b] [--lora] [--direct llm,async]
                          [--prompts N] [--tokens T] [--reps R] [--json FILE] [--work DIR]

vLLM, the gap split in one run: each bare reference (`LLM.generate`, then `AsyncLLM` driven directly) in its
own process (which exits, freeing the GPU), then kforge's VLLMBackend (worker process + pipe), all with
identical engine arguments (`load_format="dummy"`, a local config + tokenizer folder). All request the
sampled token's log-prob, as kforge always does; a direct run without log-probs is shown for information.
Target: kforge >= 0.9x the faster bare reference, with and without LoRA.
HF: `HFBackend.generate` against `model.generate` on the same batches.
With vLLM 0.23 from ../shared/device (bench/device/prepare.sh): `export PYTHONPATH=/tmp/site:. VLLM_USE_FLASHINFER_SAMPLER=0`.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback
from pathlib import Path

for key, value in {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                   "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}.items():
    os.environ.setdefault(key, value)

TARGET = 0.9
SHAPES = {
    "tiny": dict(hidden=512, layers=4, heads=8, kv_heads=8, intermediate=1408, vocab_size=8000),
    "1b": dict(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, vocab_size=32000),
}
ROWS: list[dict] = []


def row(backend: str, mode: str, prompts: int, times: list[float], tokens: int, **extra) -> dict:
    median = statistics.median(times)
    r = {"backend": backend, "mode": mode, "prompts": prompts, "tokens": tokens, "seconds": median,
         "tok_per_s": tokens / median, "reps": len(times), **extra}
    ROWS.append(r)
    print(f"  {backend:<5} {mode:<30} {tokens:>7} tokens  {median:7.2f} s  {tokens / median:9.0f} tok/s", flush=True)
    return r


def make_prompts(tok, n: int) -> list[list[int]]:
    out = []
    for i in range(n):
        body = (f"Write a fast Triton kernel for problem {i}. "
                + "The input is a float tensor of shape (4096, 4096). " * (1 + i % 5))
        text = tok.apply_chat_template([{"role": "user", "content": body}], tokenize=False, add_generation_prompt=True)
        out.append(tok(text, add_special_tokens=False)["input_ids"])
    return out


# ------------------------------------------------------------------------------------------------ vLLM
def _direct_vllm(conn, env, engine_kwargs, prompts, sampling, reps, lora_path) -> None:
    """Child process: the engine called directly, as a user of vLLM would."""
    os.environ.update(env)
    try:
        from vllm import LLM, SamplingParams
        from vllm.lora.request import LoRARequest

        llm = LLM(**engine_kwargs)
        token_prompts = [{"prompt_token_ids": p} for p in prompts]

        def params(logprobs: bool):
            return [SamplingParams(n=1, max_tokens=sampling["max_tokens"], temperature=sampling["temperature"],
                                   top_p=sampling["top_p"], seed=i, logprobs=0 if logprobs else None,
                                   include_stop_str_in_output=True) for i in range(len(prompts))]

        def timed(logprobs: bool, lora=None):
            times, tokens = [], 0
            llm.generate(token_prompts[:4], params(logprobs)[:4], use_tqdm=False, lora_request=lora)  # warm-up
            for _ in range(reps):
                t0 = time.perf_counter()
                outs = llm.generate(token_prompts, params(logprobs), use_tqdm=False, lora_request=lora)
                times.append(time.perf_counter() - t0)
                tokens = sum(len(o.outputs[0].token_ids) for o in outs)
            return times, tokens

        result = {"logprobs": timed(True), "no_logprobs": timed(False)}
        if lora_path:
            result["lora"] = timed(True, LoRARequest("bench", 1, lora_path))
        conn.send(("ok", result))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def _direct_async(conn, env, engine_kwargs, prompts, sampling, reps, lora_path) -> None:
    """Child process: vLLM's AsyncLLM called directly, every request in flight at once, final output only
    (the engine class kforge's worker drives, without kforge's process, pipe and bookkeeping)."""
    os.environ.update(env)
    try:
        import asyncio
        import itertools

        from vllm import AsyncEngineArgs, SamplingParams
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import RequestOutputKind
        from vllm.v1.engine.async_llm import AsyncLLM

        async def run() -> dict:
            engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**engine_kwargs))
            ids = itertools.count()

            async def one(i: int, prompt: list[int], lora) -> int:
                params = SamplingParams(n=1, max_tokens=sampling["max_tokens"], temperature=sampling["temperature"],
                                        top_p=sampling["top_p"], seed=i, logprobs=0, include_stop_str_in_output=True,
                                        output_kind=RequestOutputKind.FINAL_ONLY)
                final = None
                async for out in engine.generate({"prompt_token_ids": prompt}, params, f"bench-{next(ids)}",
                                                 lora_request=lora):
                    final = out
                return len(final.outputs[0].token_ids)

            async def timed(lora=None):
                await asyncio.gather(*(one(i, p, lora) for i, p in enumerate(prompts[:4])))  # warm-up
                times, tokens = [], 0
                for _ in range(reps):
                    t0 = time.perf_counter()
                    tokens = sum(await asyncio.gather(*(one(i, p, lora) for i, p in enumerate(prompts))))
                    times.append(time.perf_counter() - t0)
                return times, tokens

            result = {"logprobs": await timed()}
            if lora_path:
                result["lora"] = await timed(LoRARequest("bench", 1, lora_path))
            engine.shutdown()
            return result

        conn.send(("ok", asyncio.run(run())))
    except BaseException:
        conn.send(("error", traceback.format_exc()))


def _in_child(target, env: dict[str, str], *args) -> dict:
    """Run `target(conn, env, *args)` in a spawned process that starts with `env`; its payload."""
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=target, args=(child, env, *args))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    proc.start()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    status, payload = parent.recv()
    proc.join()
    if status != "ok":
        raise RuntimeError(f"direct vLLM run failed:\n{payload}")
    return payload


def bench_vllm(folder: Path, tok, prompts, sampling, args, lora_path: str | None) -> None:
    from kforge.rollout.base import GenerationRequest, SamplingParams
    from kforge.rollout.vllm_worker import VLLMBackend, child_env

    engine_kwargs = dict(
        model=str(folder), load_format="dummy", dtype="bfloat16", gpu_memory_utilization=args.gpu_mem,
        max_model_len=4096, enforce_eager=args.quick, enable_prefix_caching=True, enable_lora=True,
        max_lora_rank=16, max_loras=1, seed=0, logprobs_mode="processed_logprobs",
    )
    env = child_env([0])
    run_args = (engine_kwargs, prompts, sampling.__dict__, args.reps, lora_path)
    # Each bare reference in its own process, one after the other; kforge is compared with the faster one.
    references, references_lora = [], []
    for mode in args.direct:
        if mode == "async":
            print(f"vLLM AsyncLLM direct ({'eager' if args.quick else 'CUDA graphs'}) ...", flush=True)
            payload = _in_child(_direct_async, env, *run_args)
            references.append(row("vllm", "AsyncLLM direct, log-probs", len(prompts), *payload["logprobs"]))
            if lora_path:
                references_lora.append(row("vllm", "AsyncLLM direct + LoRA, log-probs", len(prompts), *payload["lora"]))
        else:
            print(f"vLLM direct engine ({'eager' if args.quick else 'CUDA graphs'}) ...", flush=True)
            payload = _in_child(_direct_vllm, env, *run_args)
            references.append(row("vllm", "LLM.generate direct, log-probs", len(prompts), *payload["logprobs"]))
            row("vllm", "LLM.generate, no log-probs (info)", len(prompts), *payload["no_logprobs"])
            if lora_path:
                references_lora.append(row("vllm", "LLM.generate + LoRA, log-probs", len(prompts), *payload["lora"]))
    direct = max(references, key=lambda r: r["tok_per_s"])
    direct_lora = max(references_lora, key=lambda r: r["tok_per_s"]) if references_lora else None

    print("vLLM through kforge (worker process + pipe) ...", flush=True)
    t0 = time.perf_counter()
    backend = VLLMBackend(tok, engine_kwargs, devices=[0], log_path=str(Path(args.work) / "vllm_worker.log"))
    print(f"  worker ready in {time.perf_counter() - t0:.0f} s", flush=True)
    try:
        requests = [GenerationRequest(p, SamplingParams(**{**sampling.__dict__, "seed": i})) for i, p in enumerate(prompts)]

        def timed():
            backend.generate(requests[:4])
            times, tokens = [], 0
            for _ in range(args.reps):
                t = time.perf_counter()
                outs = backend.generate(requests)
                times.append(time.perf_counter() - t)
                tokens = sum(len(o.token_ids) for o in outs)
            return times, tokens

        ours = row("vllm", "kforge VLLMBackend", len(prompts), *timed())
        ours["ratio"] = ours["tok_per_s"] / direct["tok_per_s"]
        if lora_path:
            backend.load_adapter(lora_path, 1)
            ours_lora = row("vllm", "kforge VLLMBackend + LoRA", len(prompts), *timed())
            ours_lora["ratio"] = ours_lora["tok_per_s"] / direct_lora["tok_per_s"]
    finally:
        backend.close()


# -------------------------------------------------------------------------------------------------- HF
def bench_hf(folder: Path, tok, prompts, sampling, args) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from kforge.rollout.base import GenerationRequest, SamplingParams
    from kforge.rollout.hf import HFBackend

    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(folder)), dtype=dtype).eval()
    pad = tok.pad_token_id
    batches = [prompts[i:i + args.hf_batch] for i in range(0, len(prompts), args.hf_batch)]

    def direct():
        tokens = 0
        for batch in batches:
            width = max(len(p) for p in batch)
            ids = torch.tensor([[pad] * (width - len(p)) + p for p in batch], device=device)
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch], device=device)
            with torch.inference_mode():
                out = model.generate(input_ids=ids, attention_mask=mask, do_sample=True, temperature=sampling.temperature,
                                     top_p=1.0, top_k=0, max_new_tokens=sampling.max_tokens, pad_token_id=pad,
                                     eos_token_id=tok.eos_token_id)
            for seq in out[:, width:].tolist():
                tokens += seq.index(tok.eos_token_id) + 1 if tok.eos_token_id in seq else len(seq)
        return tokens

    backend = HFBackend(model, tok, batch_size=args.hf_batch, device=device)
    requests = [GenerationRequest(p, SamplingParams(**{**sampling.__dict__, "seed": 0})) for p in prompts]

    def ours():
        return sum(len(o.token_ids) for o in backend.generate(requests))

    print(f"HF on {device} ...", flush=True)
    results = {}
    for name, fn in (("direct model.generate", direct), ("kforge HFBackend", ours)):
        fn()  # warm-up
        times, tokens = [], 0
        for _ in range(args.reps):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            tokens = fn()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        results[name] = row("hf", name, len(prompts), times, tokens)
    results["kforge HFBackend"]["ratio"] = (results["kforge HFBackend"]["tok_per_s"]
                                            / results["direct model.generate"]["tok_per_s"])


def print_table() -> bool:
    ok = True
    print("\n" + "=" * 104)
    print(f"{'backend':<8}{'mode':<36}{'prompts':>8}{'tokens':>9}{'seconds':>10}{'tok/s':>11}{'vs direct':>12}{'':>10}")
    print("-" * 104)
    for r in ROWS:
        ratio = r.get("ratio")
        verdict = ""
        if ratio is not None and r["backend"] == "vllm":
            verdict = "PASS" if ratio >= TARGET else "FAIL"
            ok &= ratio >= TARGET
        elif ratio is not None:
            verdict = "info"
        print(f"{r['backend']:<8}{r['mode']:<36}{r['prompts']:>8}{r['tokens']:>9}{r['seconds']:>10.2f}{r['tok_per_s']:>11.0f}"
              f"{(f'{ratio:.3f}x' if ratio is not None else ''):>12}{verdict:>10}")
    print("=" * 104)
    print(f"target for vLLM: kforge >= {TARGET}x the direct engine call (same prompts, sampling, seeds, log-probs)", flush=True)
    return ok


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rollout", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny shape, eager vLLM, 32 prompts x 128 tokens, 2 reps")
    p.add_argument("--backend", default="both", choices=["vllm", "hf", "both"])
    p.add_argument("--shape", default=None, choices=sorted(SHAPES))
    p.add_argument("--lora", action="store_true", help="also compare with a LoRA adapter active (vLLM)")
    p.add_argument("--direct", default="llm,async",
                   help="comma list of the bare references: llm (LLM.generate, one batch call), async (AsyncLLM, "
                        "the engine kforge drives); kforge is compared with the faster")
    p.add_argument("--prompts", type=int, default=None)
    p.add_argument("--tokens", type=int, default=None)
    p.add_argument("--reps", type=int, default=None)
    p.add_argument("--hf-batch", type=int, default=16)
    p.add_argument("--gpu-mem", type=float, default=0.5)
    p.add_argument("--work", default="/tmp/kforge-rollout-bench")
    p.add_argument("--json", default="")
    args = p.parse_args()
    args.shape = args.shape or "tiny"
    args.direct = [m for m in args.direct.split(",") if m]
    if not args.direct or set(args.direct) - {"llm", "async"}:
        p.error("--direct: a comma list of llm, async")
    args.prompts = args.prompts or (32 if args.quick else 64)
    args.tokens = args.tokens or (128 if args.quick else 256)
    args.reps = args.reps or (2 if args.quick else 3)

    import torch

    from bench.scratch_model import write_lora, write_model_folder
    from kforge.modelio import ModelRef, load_tokenizer
    from kforge.rollout.base import SamplingParams

    work = Path(args.work)
    shape = SHAPES[args.shape]
    folder = work / f"model-{args.shape}"
    if not (folder / "config.json").is_file():
        t0 = time.perf_counter()
        write_model_folder(folder, **shape)  # config + tokenizer only: vLLM fills dummy weights
        print(f"model folder {folder} ({shape}) in {time.perf_counter() - t0:.0f} s", flush=True)
    tok = load_tokenizer(ModelRef(str(folder)))
    prompts = make_prompts(tok, args.prompts)
    sampling = SamplingParams(max_tokens=args.tokens, temperature=1.0, top_p=1.0)
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
    print(f"GPU: {gpu}; {len(prompts)} prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), "
          f"{args.tokens} new tokens each, {args.reps} timed reps", flush=True)
    failed = False
    if args.backend in ("vllm", "both"):
        lora = str(write_lora(folder, work / "lora", rank=16, seed=1)) if args.lora else None
        try:
            bench_vllm(folder, tok, prompts, sampling, args, lora)
        except Exception as exc:
            failed = True
            print(f"vLLM bench failed: {type(exc).__name__}: {exc}", flush=True)
            traceback.print_exc()
    if args.backend in ("hf", "both"):
        bench_hf(folder, tok, prompts[: max(4, len(prompts) // (1 if torch.cuda.is_available() else 8))], sampling, args)
    ok = print_table()
    if args.json:
        Path(args.json).write_text(json.dumps({"gpu": gpu, "rows": ROWS}, indent=1))
    return 0 if ok and not failed else 1


if __name__ == "__main__":
    sys.exit(main())
