"""Tiny causal LMs built from a config (nothing downloaded) and the learner settings the learner tests share.

`one_thread` is an autouse fixture: a test module that imports it runs its tests on one intra-op thread.
`tiny_model` and `tiny_cfg` are the learner tests' model (LEARNER_VOCAB tokens) and settings; `make_learner`
builds a Learner under the one sampler setting the tests score tokens with (`learner_sampling`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kforge.config.schema import KforgeConfig
from kforge.credit.samples import Sample
from kforge.rollout.base import SamplingParams

VOCAB = 97  # unlike every other dimension of the model, so a [rows, vocab] tensor is recognisable
LEARNER_VOCAB = 16  # the learner tests' model


@pytest.fixture(autouse=True)
def one_thread():
    """The models are tiny: a second intra-op thread only adds synchronisation, and on a busy 2-core
    machine its spinning slows these tests several times over."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_model(arch: str = "llama", attn: str = "sdpa", seed: int = 0, vocab: int = VOCAB):
    """A 2-layer Llama or Qwen2 with grouped-query attention and `vocab` tokens, weights from `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                  initializer_range=0.2)
    if arch == "qwen2":
        config = Qwen2Config(**common, use_sliding_window=False)
        config._attn_implementation = attn
        return Qwen2ForCausalLM(config)
    config = LlamaConfig(**common)
    config._attn_implementation = attn
    return LlamaForCausalLM(config)


def lora_cfg(max_tokens: int, **learner) -> KforgeConfig:
    """LoRA r4 (alpha 8) on a tiny model with gradient checkpointing, `max_tokens` new tokens, `learner` fields set."""
    cfg = KforgeConfig()
    cfg.model.gradient_checkpointing = True
    cfg.lora.rank = 4
    cfg.lora.alpha = 8
    cfg.rollout.max_tokens = max_tokens
    for key, value in learner.items():
        setattr(cfg.learner, key, value)
    return cfg


def small_cfg(**learner) -> KforgeConfig:
    """LoRA r4 on a tiny model, no learning (lr 0) unless `learner` says otherwise."""
    return lora_cfg(12, **{**dict(learning_rate=0.0, warmup_steps=0, loss_fn="grpo"), **learner})


def samples(count: int = 5, seed: int = 5) -> list[Sample]:
    """`count` (at most 5) samples of mixed prompt and response lengths, alternating advantages."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i, (p, r) in enumerate([(3, 12), (7, 9), (2, 11), (5, 4), (9, 1)][:count]):
        ids = torch.randint(3, VOCAB, (p + r,), generator=gen).tolist()
        out.append(Sample(ids[:p], ids[p:], 1.0 if i % 2 else -0.5, problem_key=f"p{i // 2}"))
    return out


def perturbed(learner):
    """A fresh adapter has B = 0 (no gradient reaches A); random B makes every LoRA weight's gradient count."""
    gen = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for p in learner.params:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return learner


def tiny_model(seed: int = 0):
    """The learner tests' model: `small_model` with LEARNER_VOCAB tokens."""
    return small_model(seed=seed, vocab=LEARNER_VOCAB)


def tiny_cfg(**learner) -> KforgeConfig:
    """The learner tests' settings: LoRA r4, gradient checkpointing, 8 new tokens, `learner` fields set."""
    return lora_cfg(8, **learner)


def learner_sampling(cfg: KforgeConfig) -> SamplingParams:
    """The sampler the tests' learners score tokens under: temperature 1, the config's top-p, top-k and
    max_tokens (the samples the tests hand a learner were drawn, or written, at temperature 1)."""
    r = cfg.rollout
    return SamplingParams(r.max_tokens, 1.0, r.top_p, r.top_k)


def make_learner(cfg: KforgeConfig, **kwargs):
    """A Learner of `cfg` under `learner_sampling(cfg)`; `kwargs` as the Learner takes them (model, device, ...)."""
    from kforge.learner.learner import Learner

    return Learner(cfg, sampling=learner_sampling(cfg), **kwargs)


class Planted:
    """What a shared run folder could hold instead of a learner state: unpickling it touches a file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))
