"""Selective activation recompute: only `model.recompute_share` of the decoder layers replay their forward."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from kforge.config.schema import KforgeConfig
from kforge.learner.lora import checkpointed_layers, enable_gradient_checkpointing
from tiny_models import make_learner


def tiny_llama(layers: int = 4) -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2))


def forwards_per_layer(model: LlamaForCausalLM) -> tuple[list[int], list[torch.Tensor]]:
    """How often each decoder layer ran its forward in one forward + backward, and the gradients."""
    counts = [0] * len(model.model.layers)
    # Counted inside the layer: module hooks do not fire when backward replays a checkpointed forward.
    for i, layer in enumerate(model.model.layers):
        def counted(*args, _forward=layer.mlp.forward, _i=i, **kwargs):
            counts[_i] += 1
            return _forward(*args, **kwargs)
        layer.mlp.forward = counted
    model.train()
    model.zero_grad()
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    return counts, [p.grad.clone() for p in model.parameters()]


def test_a_share_of_layers_recomputes_and_the_gradients_do_not_change() -> None:
    plain_counts, plain_grads = forwards_per_layer(tiny_llama())
    assert plain_counts == [1, 1, 1, 1]

    half = tiny_llama()
    assert enable_gradient_checkpointing(half, 0.5) == 2
    counts, grads = forwards_per_layer(half)
    assert counts == [2, 2, 1, 1]  # the first two replay in backward; the last two kept their activations
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads, plain_grads))

    full = tiny_llama()
    assert enable_gradient_checkpointing(full) == 4
    assert forwards_per_layer(full)[0] == [2, 2, 2, 2]


def test_the_learner_applies_the_configured_share() -> None:
    cfg = KforgeConfig()
    cfg.model.gradient_checkpointing = True
    cfg.model.recompute_share = 0.25
    cfg.lora.rank = 4
    learner = make_learner(cfg, model=tiny_llama(), total_steps=1)
    assert len(checkpointed_layers(learner.model)) == 1
