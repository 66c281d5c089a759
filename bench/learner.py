#!/usr/bin/env python
"""LoRA learner throughput on one GPU: training tokens/s, MFU and peak memory.

Runs kforge's own Learner (PEFT LoRA, gradient checkpointing, Dr.GRPO loss, AdamW, grad-norm clip)
on random-init models with the real architectures of Qwen2.5-Coder-1.5B and -7B (their configs are
written out below, nothing is downloaded), at 4k and 8k tokens per sequence, in bf16 and, when
bitsandbytes imports, with a 4-bit NF4 base (QLoRA).

    python -m bench.learner            # full table (1.5B and 7B, 4k and 8k, bf16 and 4-bit)
    python -m bench.learner --quick    # 1.5B at 4k only, fewer steps
    python -m bench.learner --smoke    # a tiny model on the CPU: checks this script, measures nothing useful
    python -m bench.learner --models 7b --seq 8192 --quant bf16 --chunk 0,1024 --autocast off,on --recompute 1,0.25
                                       # today's learner (chunk 0, autocast off) beside the chunked head and bf16
    python -m bench.learner --models 7b --seq 8192 --quant bf16 --chunk 1024 --pack off,on --lengths mixed
                                       # padded rows beside packed rows, on samples of different lengths
    python -m bench.learner --models 7b --seq 8192,16384 --micro-batch-tokens 16384 --quant bf16 --chunk 1024 \
        --autocast on --pack on --recompute auto,0.25   # the share `auto` picks beside a fixed one

Conventions:
  tokens     prompt + response tokens of all sequences of a step (padding excluded)
  tokens/s   tokens / wall time of one train_step (forward, backward, optimiser), median over steps
  MFU 6N     model FLOPs / time / peak, with model FLOPs = 6 x N x tokens, N = every weight that the
             tokens pass through (frozen base + LoRA; the input embedding is a lookup and not counted),
             and the lm_head counted only for the response positions (the learner builds logits only
             there). The usual figure of full fine-tuning, where backward also forms every weight's
             gradient.
  MFU 4N     what a LoRA step really asks for: a frozen weight costs forward (2) + the gradient of its
             input (2), no weight gradient, so 4 x frozen + 6 x LoRA weights per token (lm_head 4 x, on
             response positions). Neither counts attention-score FLOPs or the extra forward of gradient
             checkpointing, so both understate the hardware's utilisation. Peak = dense bf16 tensor-core
             FLOP/s of the GPU (H100/H200 SXM 989 TFLOP/s), or --peak-tflops.
  chunk      learner.logprob_chunk: response positions per LM-head chunk (0 = full logits, as before)
  autocast   learner.bf16_autocast: LoRA matmuls in bf16 on bf16 inputs, fp32 master weights
  pack       learner.pack: samples one after another in one row (no padding), attention per sample
  lengths    same: every sample is --seq tokens (nothing to pad); mixed: lengths spread evenly from
             --seq/4 to --seq (what padding costs), the response half of each, at most 4096
  pad%       share of the model's input positions that are padding under the learner's plan
  recomp     model.recompute_share; `auto` shows the share it chose, as a*SHARE
  est GiB    kforge.learner.recompute's estimate of the peak at that share (what `auto` sizes by)
  peak GiB   torch.cuda.max_memory_allocated during the warm-up and timed steps (weights included)
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import traceback
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

if TYPE_CHECKING:
    from kforge.config.schema import KforgeConfig
    from kforge.learner.learner import Learner

# Written out from the published config.json files of the two models.
ARCHS: dict[str, dict[str, Any]] = {
    "1.5b": dict(
        hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
    ),
    "7b": dict(
        hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
        num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=False, hidden_act="silu", use_sliding_window=False,
    ),
    # --smoke only: the same code path on a CPU in seconds.
    "smoke": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=512, max_position_embeddings=4096, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", use_sliding_window=False,
    ),
}

PEAK_TFLOPS = [("H200", 989.4), ("H100 PCIe", 756.0), ("H100", 989.4), ("A100", 312.0), ("L40S", 362.0), ("A10", 125.0)]


def model_flops(frozen: int, trainable: int, head: int, tokens: int, response_tokens: int) -> tuple[float, float]:
    """FLOPs of one step by the 6N count and by the 4N count (see the module docstring)."""
    six = 6.0 * (frozen + trainable) * tokens + 6.0 * head * response_tokens
    four = (4.0 * frozen + 6.0 * trainable) * tokens + 4.0 * head * response_tokens
    return six, four


def learner_config(args: argparse.Namespace, response_tokens: int, recompute: float | str = 1.0, chunk: int = 0,
                   autocast: bool = False, pack: bool = False, longest: int = 32768) -> KforgeConfig | SimpleNamespace:
    """kforge's config with the bench's settings; a plain namespace where pydantic is not installed
    (the GPU image lacks it), holding the same fields with the schema's defaults."""
    lora = dict(rank=args.lora_rank, alpha=2 * args.lora_rank, dropout=0.0,
                target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    learner = dict(loss_fn="dr_grpo", learning_rate=2e-5, weight_decay=0.0, warmup_steps=0, lr_schedule="constant",
                   grad_clip=0.05, num_substeps=1, micro_batch_tokens=args.micro_batch_tokens,
                   loss_aggregation="token_mean", advantage_baseline="mean", normalize_std=None,
                   remove_constant_reward_groups=True, clip_low=0.2, clip_high=0.28, is_clip=2.0,
                   kl_coef=0.0, kl_discount=0.0, kl_estimator="k3", entropy_coef=0.0,
                   mismatch_reject_ratio=None, mismatch_token_veto=None, logprob_chunk=chunk, bf16_autocast=autocast,
                   pack=pack)
    model = dict(name="random-init", gguf_file=None, dtype="bfloat16", load_in_4bit=False, chat_template=None,
                 trust_remote_code=False, max_model_len=longest, gradient_checkpointing=not args.no_grad_ckpt,
                 recompute_share=recompute, checkpoint=None)
    try:
        from kforge.config.schema import KforgeConfig

        cfg = KforgeConfig()
        for section, values in (("lora", lora), ("learner", learner), ("model", model)):
            for key, value in values.items():
                setattr(getattr(cfg, section), key, value)
        cfg.rollout.max_tokens = response_tokens
        return cfg
    except ImportError:
        return SimpleNamespace(
            model=SimpleNamespace(**model), lora=SimpleNamespace(**lora), learner=SimpleNamespace(**learner),
            rollout=SimpleNamespace(max_tokens=response_tokens), max_steps=None,
        )


def build_model(arch: str, device: str, quant: str) -> tuple[Any, int, int]:
    """Random-init Qwen2 causal LM; returns it, the weights every token passes through, and lm_head's."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**ARCHS[arch])
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        model = Qwen2ForCausalLM._from_config(config, dtype=dtype)
    body = sum(p.numel() for n, p in model.named_parameters() if "embed_tokens" not in n and "lm_head" not in n)
    head = config.vocab_size * config.hidden_size
    if quant == "4bit":
        quantize_to_nf4(model, device)
    return model, body, head


def quantize_to_nf4(model: torch.nn.Module, device: str) -> None:
    """Swap every decoder Linear for a bitsandbytes NF4 Linear4bit (what from_pretrained with a
    BitsAndBytesConfig would load), layer by layer to keep the memory peak low."""
    import bitsandbytes as bnb

    for layer in model.model.layers:
        for parent in list(layer.modules()):
            for name, child in list(parent.named_children()):
                if not isinstance(child, torch.nn.Linear):
                    continue
                q = bnb.nn.Linear4bit(
                    child.in_features, child.out_features, bias=child.bias is not None,
                    compute_dtype=torch.bfloat16, quant_type="nf4", compress_statistics=True,
                )
                q.weight = bnb.nn.Params4bit(
                    child.weight.data.to("cpu"), requires_grad=False, quant_type="nf4", compress_statistics=True
                )
                if child.bias is not None:
                    q.bias = torch.nn.Parameter(child.bias.data.clone(), requires_grad=False)
                setattr(parent, name, q.to(device))
                del child
        torch.cuda.empty_cache()
    model.is_loaded_in_4bit = True  # tells kforge (and PEFT) to prepare the model for k-bit training


def sample_lengths(n: int, seq: int, lengths: str) -> list[int]:
    """Every sample --seq tokens, or (mixed) spread evenly from seq/4 to seq, shuffled the same way each run."""
    if lengths == "same" or n < 2:
        return [seq] * n
    spread = [seq // 4 + (seq - seq // 4) * i // (n - 1) for i in range(n)]
    order = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
    return [spread[i] for i in order]


def make_samples(lengths: list[int], vocab: int, seed: int) -> list[Any]:
    from kforge.credit.samples import Sample

    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, seq in enumerate(lengths):
        response = min(seq // 2, 4096)
        ids = torch.randint(10, vocab, (seq,), generator=gen).tolist()
        out.append(Sample(ids[: seq - response], ids[seq - response:], advantage=1.0 if i % 2 else -1.0,
                          problem_key=f"bench/{i // 2}"))
    return out


def peak_tflops(args: argparse.Namespace) -> float | None:
    if args.peak_tflops:
        return args.peak_tflops
    if not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name()
    for key, value in PEAK_TFLOPS:
        if key in name:
            return value
    return None


def run_case(args: argparse.Namespace, arch: str, quant: str, seq: int, recompute: float | str, chunk: int = 0,
             autocast: bool = False, pack: bool = False) -> dict[str, Any]:
    from kforge.learner.learner import Learner
    from kforge.learner.packing import padding_share
    from kforge.rollout.base import SamplingParams

    response = min(seq // 2, 4096)
    mean = seq if args.lengths == "same" else 0.625 * seq  # mixed: lengths from seq/4 to seq
    n = max(2, int(args.tokens_per_step // mean))
    lengths = sample_lengths(n, seq, args.lengths)
    row: dict[str, Any] = dict(model=arch, quant=quant, seq=seq, samples=n, recompute=recompute, chunk=chunk,
                               autocast=autocast, pack=pack,
                               pad=padding_share(lengths, args.micro_batch_tokens, pack))
    cuda = args.device.startswith("cuda")
    learner = model = None
    try:
        model, body, head = build_model(arch, args.device, quant)
        # The longest sample is the model's context: what an `auto` share sizes a row by beside the budget.
        cfg = learner_config(args, response, recompute, chunk, autocast, pack, longest=seq)
        # Scored as sampled at temperature 1 without truncation; the response budget is dr_grpo's constant.
        learner = Learner(cfg, device=args.device, model=model, sampling=SamplingParams(max_tokens=response))
        row.update(estimate(learner, cfg, recompute))
        if cuda:  # the peak of training, not of building the bf16 model before quantising it
            torch.cuda.reset_peak_memory_stats()
        samples = make_samples(lengths, ARCHS[arch]["vocab_size"], seed=seq)
        tokens = sum(s.num_tokens for s in samples)
        response_tokens = sum(len(s.response_ids) for s in samples)
        times = []
        for step in range(args.warmup + args.steps):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            metrics = learner.train_step(samples)
            if cuda:
                torch.cuda.synchronize()
            if step >= args.warmup:
                times.append(time.perf_counter() - t0)
        step_s = statistics.median(times)
        trainable = sum(p.numel() for p in learner.params)
        six, four = model_flops(body, trainable, head, tokens, response_tokens)
        peak = peak_tflops(args)
        row.update(
            tokens=tokens, step_s=step_s, tok_s=tokens / step_s,
            mfu=(six / step_s / (peak * 1e12)) if peak else None,
            mfu4=(four / step_s / (peak * 1e12)) if peak else None,
            peak_gib=torch.cuda.max_memory_allocated() / 2**30 if cuda else None,
            trainable_m=trainable / 1e6, loss=metrics["loss"], grad_norm=metrics["grad_norm"], status="ok",
        )
    except torch.cuda.OutOfMemoryError:
        row["status"] = "OOM"
    except Exception as exc:  # one broken case must not hide the others
        row["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}"
        if args.verbose:
            traceback.print_exc()
    finally:
        del learner, model
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()
    return row


def estimate(learner: Learner, cfg: KforgeConfig | SimpleNamespace, recompute: float | str) -> dict[str, Any]:
    """The share the learner applied (what `auto` chose) and the estimated peak at it (kforge.learner.recompute)."""
    from kforge.learner.lora import checkpointed_layers
    from kforge.learner.recompute import GIB, peak_bytes, shape_of

    shape = shape_of(learner.model)
    recomputed = len(checkpointed_layers(learner.model)) if cfg.model.gradient_checkpointing else 0
    lc, out = cfg.learner, {"auto": recompute == "auto"}
    if learner.recompute is not None:
        out["recompute"] = learner.recompute.share
    if shape is not None and learner.device.type == "cuda":
        tokens = max(lc.micro_batch_tokens, cfg.model.max_model_len)
        out["est_gib"] = peak_bytes(shape, recomputed, tokens, lc.logprob_chunk, lc.bf16_autocast) / GIB
    return out


def share_label(row: dict[str, Any]) -> str:
    share = row["recompute"]
    return share if isinstance(share, str) else f"a{share:.2f}" if row.get("auto") else f"{share:g}"


def fmt(value: object, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict[str, Any]]) -> None:
    header = f"{'model':<6} {'quant':<5} {'seq':>5} {'recomp':>6} {'chunk':>5} {'bf16ac':>6} {'pack':>4} {'pad%':>5} " \
             f"{'n':>3} {'tokens':>7} " \
             f"{'step s':>7} {'tokens/s':>9} {'MFU6N%':>6} {'MFU4N%':>6} {'est GiB':>7} {'peak GiB':>8} {'LoRA M':>7}  status"
    print(header)
    print("-" * len(header))
    for r in rows:
        mfu = None if r.get("mfu") is None else 100 * r["mfu"]
        mfu4 = None if r.get("mfu4") is None else 100 * r["mfu4"]
        print(
            f"{r['model']:<6} {r['quant']:<5} {r['seq']:>5} {share_label(r):>6} {r['chunk']:>5} "
            f"{'on' if r['autocast'] else 'off':>6} {'on' if r['pack'] else 'off':>4} {100 * r['pad']:>5.1f} "
            f"{r['samples']:>3} {fmt(r.get('tokens'), 'd'):>7} "
            f"{fmt(r.get('step_s'), '.2f'):>7} {fmt(r.get('tok_s'), ',.0f'):>9} {fmt(mfu, '.1f'):>6} {fmt(mfu4, '.1f'):>6} "
            f"{fmt(r.get('est_gib'), '.1f'):>7} {fmt(r.get('peak_gib'), '.1f'):>8} {fmt(r.get('trainable_m'), '.1f'):>7}  "
            f"{r['status']}",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.learner", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="1.5B at 4k only, 1 warm-up + 2 timed steps")
    parser.add_argument("--smoke", action="store_true", help="tiny model on the CPU (checks the script)")
    parser.add_argument("--models", default="1.5b,7b", help="comma list of: " + ", ".join(a for a in ARCHS if a != "smoke"))
    parser.add_argument("--seq", default="4096,8192", help="comma list of sequence lengths (prompt + response)")
    parser.add_argument("--quant", default="bf16,4bit", help="comma list of bf16, 4bit (4bit needs bitsandbytes)")
    parser.add_argument("--recompute", default="1", help="comma list of model.recompute_share values: the share "
                        "of layers that recompute activations in backward (1 = all, 0 = none, auto = by memory)")
    parser.add_argument("--chunk", default="0", help="comma list of learner.logprob_chunk values (0 = full logits)")
    parser.add_argument("--autocast", default="off", help="comma list of off, on: learner.bf16_autocast")
    parser.add_argument("--pack", default="off", help="comma list of off, on: learner.pack (packed rows)")
    parser.add_argument("--lengths", default="same", choices=["same", "mixed"],
                        help="sample lengths: all --seq, or mixed from --seq/4 to --seq (see the docstring)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per case")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps per case")
    parser.add_argument("--tokens-per-step", type=int, default=32768, help="tokens per train_step (n = this / seq)")
    parser.add_argument("--micro-batch-tokens", type=int, default=16384, help="learner.micro_batch_tokens")
    parser.add_argument("--lora-rank", type=int, default=32)
    parser.add_argument("--no-grad-ckpt", action="store_true", help="turn gradient checkpointing off")
    parser.add_argument("--peak-tflops", type=float, default=None, help="peak bf16 TFLOP/s for MFU (auto for H100/H200/A100)")
    parser.add_argument("--device", default=None, help="default: cuda if available")
    parser.add_argument("--verbose", action="store_true", help="print tracebacks of failing cases")
    args = parser.parse_args()
    for flag, value in (("--autocast", args.autocast), ("--pack", args.pack)):
        if any(a.strip() not in ("on", "off") for a in value.split(",")):
            print(f"bench.learner: {flag} {value!r}: a comma list of on, off", file=sys.stderr)
            return 2

    if args.smoke:
        args.device = args.device or "cpu"
        models, seqs, quants = ["smoke"], [256, 512], ["bf16"]
        args.tokens_per_step, args.micro_batch_tokens, args.steps = 1024, 512, min(args.steps, 2)
    else:
        args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
        if not args.device.startswith("cuda"):
            print("bench.learner: no CUDA device; run it on a GPU machine, or pass --smoke to check it on a CPU",
                  file=sys.stderr)
            return 2
        models = [m.strip() for m in args.models.split(",") if m.strip()]
        seqs = [int(s) for s in args.seq.split(",") if s.strip()]
        quants = [q.strip() for q in args.quant.split(",") if q.strip()]
        if args.quick:
            models, seqs, args.steps = models[:1], seqs[:1], min(args.steps, 2)
        bad = [m for m in models if m not in ARCHS] + [q for q in quants if q not in ("bf16", "4bit")]
        if bad:
            print(f"bench.learner: unknown --models/--quant value {bad[0]!r}", file=sys.stderr)
            return 2
        if "4bit" in quants:
            try:
                import bitsandbytes  # noqa: F401
            except Exception as exc:  # ImportError, or a broken CUDA setup inside bitsandbytes
                print(f"4-bit rows skipped: bitsandbytes does not import ({type(exc).__name__})")
                quants = [q for q in quants if q != "4bit"]

    import peft
    import transformers

    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
    peak = peak_tflops(args)
    print(f"device {gpu} | torch {torch.__version__} | transformers {transformers.__version__} | peft {peft.__version__}")
    print(f"LoRA rank {args.lora_rank} on all linear layers, gradient checkpointing "
          f"{'off' if args.no_grad_ckpt else 'on'}, micro-batch {args.micro_batch_tokens} tokens, "
          f"{args.warmup} warm-up + {args.steps} timed steps, MFU peak {fmt(peak, '.0f')} TFLOP/s")
    print("MFU6N = 6 x (frozen + LoRA weights, lm_head on response tokens only) x tokens / step time / peak")
    print("MFU4N = (4 x frozen + 6 x LoRA weights, lm_head 4 x on response tokens) x tokens / step time / peak\n")
    chunks = [int(c) for c in args.chunk.split(",") if c.strip()]
    shares = [x.strip() if x.strip() == "auto" else float(x) for x in args.recompute.split(",") if x.strip()]
    autocasts = [a.strip() == "on" for a in args.autocast.split(",") if a.strip()]
    packs = [a.strip() == "on" for a in args.pack.split(",") if a.strip()]

    rows = []
    for arch in models:
        for quant in quants:
            for seq in seqs:
                for share in shares:
                    for chunk in chunks:
                        for autocast in autocasts:
                            for pack in packs:
                                row = run_case(args, arch, quant, seq, share, chunk, autocast, pack)
                                rows.append(row)
                                if args.verbose:
                                    print(row, flush=True)
    print_table(rows)
    return 0 if all(r["status"] in ("ok", "OOM") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
