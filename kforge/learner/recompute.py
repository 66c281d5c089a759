"""How many decoder layers recompute their activations in backward: `model.recompute_share`, or chosen by
memory with `model.recompute_share=auto`.

A layer that keeps its activations saves its backward one forward (a third of its training FLOPs) and costs
their memory; a recomputed layer stores only its input. `auto` picks the fewest recomputed layers whose
estimated peak fits the learner GPU's budget: its total memory x `SAFETY`, less what other processes keep on
that GPU while the learner trains (`reserve`, from the run's placement). It is an estimate, fitted to a few
measurements of one shape (below); it is not a guarantee, hence the safety fraction.

The estimate of one micro-batch's peak (bytes), at `tokens` tokens in the row:
- the base weights as loaded (counted from the model's parameters) and `LORA_BYTES` per LoRA parameter;
- each kept layer: tokens x (8 hidden + 4 intermediate) x width (the norms' fp32 inputs, the attention
  projections' inputs and outputs, the MLP's gate, up, activation and product); without bf16 autocast a
  half-precision model also keeps PEFT's fp32 copies of the LoRA inputs, tokens x (6 hidden + 2 intermediate)
  x 2 more (see `bf16_compute` in lora.py);
- each recomputed layer: its input, tokens x hidden x width; and while one replays in backward, that one
  layer's activations (the kept layers, the last ones, were freed by then: the larger of the two counts);
- the LM head's working set, `HEAD_COPIES` x chunk x vocab x 4 bytes (fp32 logits of one chunk of
  `learner.logprob_chunk` positions, their log-softmax and gradients), and `SLACK` for the rest.

Calibration (peak = torch.cuda.max_memory_allocated; Qwen2.5-Coder-7B shape, random bf16 weights, LoRA r32 on
every linear, `bench/learner.py`, torch 2.11), the estimate in brackets:
- H100 80GB, bf16 autocast, chunk 1024, packed rows, 8192 tokens, share 0.25: 52.6 GiB [53.9]; 16384 tokens,
  share 1: 24.8 GiB [26.3]; 16384 tokens, share 0.25: out of memory [87.7, over the GPU's 79.1];
- H200, the same at 8192 tokens, share 0.25: 53.4 GiB [53.9]; without autocast 70.9 GiB [72.9];
- H100 80GB, no autocast, full logits (chunk 0), 8192 tokens: share 1 23.9 GiB [40.3], 0.5 57.5 [72.0], 0.25
  74.3 [89.1]: full logits are over-counted (every position of the row, `HEAD_COPIES` times), which is safe.
Per kept layer, the two autocast H100 rows give 1.007 x (8 hidden + 4 intermediate) x 2 bytes a token (two
rows, two unknowns: that and the constant); the fp32 copies' term comes from the H200 pair (17.5 GiB more
over 21 kept layers without autocast: 0.83 GiB a layer, the term gives 0.91). One shape, a few rows: the
estimate is not validated beyond them (a real run's rows of varying length may also fragment the allocator
more than the bench's fixed ones), hence `SAFETY` and `SLACK`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: torch is imported where it is used, the config stack not at all
    import torch

    from kforge.config.schema import KforgeConfig

GIB = 2**30
SAFETY = 0.9  # of the GPU's memory: the allocator's fragmentation (reserved > allocated), the CUDA context
LORA_BYTES = 20  # fp32 weight, its gradient, AdamW's two moments, and a micro-batch's gradient before it is added
HEAD_COPIES = 4  # a chunk's fp32 logits, log-softmax, and their gradients in backward
SLACK = 2 * GIB  # what the terms above leave out: the measured peaks sit 0.5-1.5 GiB above them


@dataclass(frozen=True)
class Shape:
    """What the estimate reads of a model."""

    layers: int
    hidden: int
    intermediate: int
    vocab: int
    weight_bytes: int  # the base model's parameters as loaded (bf16: 2 bytes each; 4-bit: about half a byte)
    lora_params: int  # trainable (LoRA) parameters


@dataclass(frozen=True)
class Choice:
    """The share the learner applies, and why (one line for the log)."""

    share: float
    why: str
    estimate_bytes: int = 0  # the estimated peak at that share; 0 where nothing was estimated
    fits: bool = True  # False: even every layer recomputing is estimated over the budget


def peak_bytes(shape: Shape, recomputed: int, tokens: int, chunk: int, autocast: bool = True, width: int = 2) -> int:
    """The estimated peak of one micro-batch of `tokens` with `recomputed` of the layers (the first ones)
    recomputing (see the module docstring)."""
    per_token = (8 * shape.hidden + 4 * shape.intermediate) * width
    if width == 2 and not autocast:
        per_token += (6 * shape.hidden + 2 * shape.intermediate) * 2
    layer = tokens * per_token
    kept = shape.layers - recomputed
    activations = max(kept, 1 if recomputed else 0) * layer + recomputed * tokens * shape.hidden * width
    head = HEAD_COPIES * min(chunk or tokens, tokens) * shape.vocab * 4
    return shape.weight_bytes + LORA_BYTES * shape.lora_params + activations + head + SLACK


def choose_share(shape: Shape, tokens: int, chunk: int, gpu_bytes: int, reserve_bytes: int = 0,
                 autocast: bool = True, width: int = 2) -> Choice:
    """The smallest share (in whole layers) whose estimated peak fits gpu_bytes x SAFETY - reserve_bytes;
    1.0, not fitting, when none does."""
    budget = int(gpu_bytes * SAFETY) - reserve_bytes
    where = (f"{tokens} tokens a row, budget {budget / GIB:.1f} GiB = {SAFETY:g} x {gpu_bytes / GIB:.1f} GiB"
             + (f" - {reserve_bytes / GIB:.1f} GiB for the GPU's other processes" if reserve_bytes else ""))
    for recomputed in range(shape.layers + 1):
        estimate = peak_bytes(shape, recomputed, tokens, chunk, autocast, width)
        if estimate <= budget:
            share = recomputed / shape.layers if shape.layers else 1.0
            return Choice(share, f"recompute_share auto: {recomputed} of {shape.layers} layers recompute "
                          f"(share {share:.2f}), estimated peak {estimate / GIB:.1f} GiB ({where})", estimate)
    return Choice(1.0, f"recompute_share auto: even with all {shape.layers} layers recomputing the estimated "
                  f"peak {estimate / GIB:.1f} GiB is over the budget ({where}); lower learner.micro_batch_tokens "
                  "(and model.max_model_len, whose longest sample is a row of its own)", estimate, fits=False)


def shape_of(model: torch.nn.Module) -> Shape | None:
    """The estimate's view of a (PEFT-wrapped) transformers model; None when its config lacks a size."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    config = getattr(base, "config", None)
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    sizes = [getattr(text, k, None) for k in ("num_hidden_layers", "hidden_size", "intermediate_size", "vocab_size")]
    if not all(isinstance(s, int) and s > 0 for s in sizes):
        return None
    frozen = sum(p.numel() * p.element_size() for p in model.parameters() if not p.requires_grad)
    lora = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return Shape(*sizes, weight_bytes=frozen, lora_params=lora)


def choose_for(model: torch.nn.Module, cfg: KforgeConfig, device: torch.device | str, reserve_gib: float = 0.0) -> Choice:
    """The share for `cfg.model.recompute_share`: the number as it is, or `auto` sized for the learner's GPU
    less `reserve_gib` for other processes on it. The row: `learner.micro_batch_tokens`, or a longer sample
    alone (up to `model.max_model_len`)."""
    share = cfg.model.recompute_share
    if share != "auto":
        return Choice(float(share), f"recompute_share {float(share):g} (set in the config)")
    import torch

    if torch.device(device).type != "cuda":
        return Choice(1.0, "recompute_share auto: no CUDA device, no memory to fit: every layer recomputes")
    shape = shape_of(model)
    if shape is None:
        return Choice(1.0, "recompute_share auto: the model's config lacks a layer count or size; every layer "
                           "recomputes")
    lc = cfg.learner
    tokens = max(lc.micro_batch_tokens, cfg.model.max_model_len)
    half = getattr(getattr(model, "dtype", None), "itemsize", 2) <= 2
    return choose_share(shape, tokens, lc.logprob_chunk, torch.cuda.get_device_properties(device).total_memory,
                        int(reserve_gib * GIB), autocast=lc.bf16_autocast, width=2 if half or lc.bf16_autocast else 4)
