"""The learner's log-probs with the LM head run per chunk of positions, and under bf16 autocast, against the
full-logits fp32 path, on a small random-init Llama built from a config (nothing is downloaded)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kforge.learner.batching import collate
from kforge.learner.learner import Learner
from kforge.learner.logprobs import response_logprobs, split_head
from tiny_models import VOCAB, make_learner, one_thread, perturbed, samples, small_cfg, small_model  # noqa: F401 (one_thread: autouse)


def logp_entropy_and_grads(chunk: int) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    learner = perturbed(make_learner(small_cfg(logprob_chunk=chunk), model=small_model()))
    batch = collate(samples(4), [0, 1, 2, 3], learner.pad_id, learner.device)
    learner.model.train()
    logp, entropy = response_logprobs(learner.model, batch, 0.9, chunk=chunk, entropy=True, entropy_grad=True)
    mask = batch.response_mask
    loss = torch.where(mask, logp * batch.advantages - 0.1 * entropy, 0.0).sum()
    grads = torch.autograd.grad(loss, learner.params)
    return logp.detach(), entropy.detach(), list(grads)


def test_chunked_head_gives_the_full_logits_log_probs_entropy_and_gradients():
    full_logp, full_ent, full_grads = logp_entropy_and_grads(0)
    for chunk in (1, 5, 1024):
        logp, ent, grads = logp_entropy_and_grads(chunk)
        torch.testing.assert_close(logp, full_logp, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(ent, full_ent, rtol=1e-5, atol=1e-6)
        for a, b in zip(grads, full_grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    assert any(float(g.abs().max()) > 0 for g in full_grads)


class _LogitRows(TorchDispatchMode):
    """The most positions of any [.., vocab]-shaped tensor allocated by an op of a forward and backward."""

    def __init__(self) -> None:
        super().__init__()
        self.most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.is_view:  # allocates nothing (e.g. the head weight's transpose, [hidden, vocab])
            return out
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.dim() >= 2 and t.shape[-1] == VOCAB:
                self.most = max(self.most, t.numel() // VOCAB)
        return out


@pytest.mark.parametrize("chunk", [0, 4])
def test_chunked_head_never_holds_logits_of_more_than_a_chunk_of_positions(chunk):
    learner = perturbed(make_learner(small_cfg(logprob_chunk=chunk), model=small_model()))
    batch = collate(samples(4), [0, 1, 2, 3], learner.pad_id, learner.device)
    positions = batch.targets.numel()
    learner.model.train()
    with _LogitRows() as rows:
        logp, entropy = response_logprobs(learner.model, batch, chunk=chunk, entropy=True)
        torch.autograd.grad(torch.where(batch.response_mask, logp, 0.0).sum(), learner.params)
    if chunk:
        assert 0 < rows.most <= chunk < positions
    else:  # the check sees the full logits when they are built
        assert rows.most >= positions


def test_a_train_step_is_the_same_with_chunked_and_full_logits():
    cfg = dict(learning_rate=1e-2, num_substeps=2, entropy_coef=0.01)
    full = perturbed(make_learner(small_cfg(logprob_chunk=0, **cfg), model=small_model()))
    chunked = perturbed(make_learner(small_cfg(logprob_chunk=3, **cfg), model=small_model()))
    torch.manual_seed(0)
    a = full.train_step(samples(4))
    torch.manual_seed(0)
    b = chunked.train_step(samples(4))
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-8)
    assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-5)
    for p, q in zip(full.params, chunked.params):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-7)


def test_a_head_that_is_not_a_plain_linear_map_takes_the_full_logits_path():
    from transformers import Gemma2Config, Gemma2ForCausalLM

    model = Gemma2ForCausalLM(Gemma2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                           final_logit_softcapping=30.0))
    assert split_head(model) is None  # soft-capped logits: lm_head alone would give other log-probs
    assert split_head(small_model()) is not None


class _MatmulDtypes(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.dtypes: set[torch.dtype] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm):
            self.dtypes.add(args[-1].dtype)
        return func(*args, **(kwargs or {}))


def test_bf16_autocast_keeps_fp32_master_weights_and_gradients_within_bf16_tolerance():
    ref = perturbed(make_learner(small_cfg(), model=small_model()))
    bf16 = perturbed(make_learner(small_cfg(bf16_autocast=True), model=small_model()))
    torch.manual_seed(0)
    a = ref.train_step(samples(4))
    torch.manual_seed(0)
    with _MatmulDtypes() as seen:
        b = bf16.train_step(samples(4))
    assert torch.bfloat16 in seen.dtypes  # the matmuls really ran in bf16
    assert all(p.dtype == torch.float32 for p in bf16.params)  # AdamW updates fp32 master weights
    assert all(s["exp_avg"].dtype == torch.float32 for s in bf16.optimizer.state.values()) or not bf16.optimizer.state
    assert b["loss"] == pytest.approx(a["loss"], rel=3e-2, abs=1e-3)
    for p, q in zip(ref.params, bf16.params):
        # bf16 keeps 8 bits of mantissa (0.4 % per rounding); through two layers, attention and the loss the
        # LoRA gradients land 3-4 % (relative norm) from fp32's here, in the same direction.
        diff = float((p.grad - q.grad).norm() / p.grad.norm())
        cosine = float(torch.nn.functional.cosine_similarity(p.grad.flatten(), q.grad.flatten(), dim=0))
        assert diff < 6e-2 and cosine > 0.998, (diff, cosine)


def saved_bytes(learner: Learner, cast_input: bool) -> int:
    """Bytes of distinct storages autograd keeps for backward in one forward of a bf16 base under autocast."""
    from kforge.learner.lora import bf16_compute

    batch = collate(samples(4), [0, 1, 2, 3], learner.pad_id, learner.device)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    learner.model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        if cast_input:  # PEFT's default: the LoRA input is cast to the adapter's fp32 first
            with torch.autocast("cpu", dtype=torch.bfloat16):
                response_logprobs(learner.model, batch, chunk=0)
        else:
            with bf16_compute(learner.model, learner.device, True):
                response_logprobs(learner.model, batch, chunk=0)
    return sum(storages.values())


def test_bf16_autocast_saves_no_second_copy_of_each_lora_input():
    cfg = small_cfg()
    cfg.model.gradient_checkpointing = False  # every layer's saved activations, not just the boundaries
    learner = perturbed(make_learner(cfg, model=small_model().to(torch.bfloat16)))
    assert all(p.dtype == torch.float32 for p in learner.params)  # PEFT keeps the adapter in fp32
    with_cast, without = saved_bytes(learner, cast_input=True), saved_bytes(learner, cast_input=False)
    assert without < 0.9 * with_cast, (without, with_cast)
