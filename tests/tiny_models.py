"""Tiny causal LMs built from a config (nothing downloaded) and the learner settings the learner tests share.

`one_thread` is an autouse fixture: a test module that imports it runs its tests on one intra-op thread."""

from __future__ import annotations

import pytest
import torch

from kforge.config.schema import KforgeConfig

VOCAB = 97  # unlike every other dimension of the model, so a [rows, vocab] tensor is recognisable


@pytest.fixture(autouse=True)
def one_thread():
    """The models are tiny: a second intra-op thread only adds synchronisation, and on a busy 2-core
    machine its spinning slows these tests several times over."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_model(arch: str = "llama", attn: str = "sdpa", seed: int = 0):
    """A 2-layer Llama or Qwen2 with grouped-query attention and VOCAB tokens, weights from `seed`."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                  initializer_range=0.2)
    if arch == "qwen2":
        config = Qwen2Config(**common, use_sliding_window=False)
        config._attn_implementation = attn
        return Qwen2ForCausalLM(config)
    config = LlamaConfig(**common)
    config._attn_implementation = attn
    return LlamaForCausalLM(config)


def small_cfg(**learner) -> KforgeConfig:
    """LoRA r4 on a tiny model, no learning (lr 0) unless `learner` says otherwise."""
    cfg = KforgeConfig()
    cfg.model.gradient_checkpointing = True
    cfg.lora.rank = 4
    cfg.lora.alpha = 8
    cfg.rollout.max_tokens = 12
    for key, value in {**dict(learning_rate=0.0, warmup_steps=0, loss_fn="grpo"), **learner}.items():
        setattr(cfg.learner, key, value)
    return cfg
