"""Packed micro-batches (learner.pack): several samples in one row, position_ids restarting per sample. The
log-probs and LoRA gradients equal the padded rows', with transformers' own packed masks (eager, sdpa) and
with kforge's variable-length attention, and no sample's attention reaches another's tokens. Small
random-init Llama and Qwen2 models built from a config (nothing is downloaded)."""

from __future__ import annotations

import pytest
import torch

from kforge.credit.samples import Sample
from kforge.learner import varlen
from kforge.learner.batching import collate
from kforge.learner.learner import Learner
from kforge.learner.logprobs import response_logprobs
from kforge.learner.packing import collate_packed, padding_share, plan, plan_packed
from tiny_models import VOCAB, make_learner, one_thread, perturbed, samples, small_cfg, small_model  # noqa: F401 (one_thread: autouse)


def learner_for(arch: str, attn: str, pack: bool, **cfg) -> Learner:
    """attn: eager or sdpa as transformers has them, or varlen (sdpa replaced by kforge_varlen)."""
    model = small_model(arch, "sdpa" if attn == "varlen" else attn)
    learner = perturbed(make_learner(small_cfg(pack=pack, **cfg), model=model))
    if pack and attn == "sdpa":  # transformers' own dense packed mask: undo the learner's switch to varlen
        learner.model.get_base_model().set_attn_implementation("sdpa")
    expected = varlen.NAME if pack and attn == "varlen" else attn
    assert learner.model.get_base_model().config._attn_implementation == expected
    return learner


def logp_and_grads(learner: Learner, batch, chunk: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    learner.model.train()
    logp, entropy = response_logprobs(learner.model, batch, 0.9, chunk=chunk, entropy=True, entropy_grad=True)
    loss = torch.where(batch.response_mask, logp * batch.advantages - 0.1 * entropy, 0.0).sum()
    return logp.detach(), list(torch.autograd.grad(loss, learner.params))


def test_plan_packed_fills_rows_under_the_budget_longest_first():
    lengths = [5, 9, 3, 30, 4, 7]
    rows = plan_packed(lengths, 12)
    assert sorted(i for r in rows for i in r) == list(range(len(lengths)))
    assert rows[0] == [3]  # longer than the budget: a row of its own
    assert all(sum(lengths[i] for i in r) <= 12 for r in rows[1:])
    assert len(rows) == 4  # 30 | 9 3 | 7 5 | 4
    assert plan(lengths, 12, pack=False) != rows  # padded plans count rows x longest
    assert padding_share(lengths, 12, pack=True) == 0.0
    assert 0.0 < padding_share([10, 2, 2], 30, pack=False) < 1.0


def test_a_packed_row_restarts_positions_and_points_at_the_states_that_predict_each_target():
    data = samples()
    batch = collate_packed(data, [1, 3], 0, torch.device("cpu"))
    a, b = data[1], data[3]
    assert batch.input_ids.tolist() == [a.prompt_ids + a.response_ids + b.prompt_ids + b.response_ids]
    assert batch.position_ids.tolist() == [list(range(a.num_tokens)) + list(range(b.num_tokens))]
    assert batch.segments["cu_seq_lens_q"].tolist() == [0, a.num_tokens, a.num_tokens + b.num_tokens]
    assert not batch.padded and batch.real_tokens == a.num_tokens + b.num_tokens
    ids = batch.input_ids[0]
    for row, s in enumerate((a, b)):
        k = len(s.response_ids)
        # The token after each picked position is the target.
        assert ids[batch.positions[row, -k:] + 1].tolist() == s.response_ids == batch.targets[row, -k:].tolist()


@pytest.mark.parametrize("arch,attn", [("llama", "sdpa"), ("llama", "eager"), ("llama", "varlen"), ("qwen2", "varlen")])
@pytest.mark.parametrize("chunk", [0, 3])
def test_packed_log_probs_and_lora_gradients_equal_the_padded_rows(arch, attn, chunk):
    data, rows = samples(), [0, 1, 2, 3, 4]
    padded = learner_for(arch, attn if attn != "varlen" else "sdpa", pack=False)
    packed = learner_for(arch, attn, pack=True)
    ref_logp, ref_grads = logp_and_grads(padded, collate(data, rows, padded.pad_id, padded.device), chunk)
    logp, grads = logp_and_grads(packed, collate_packed(data, rows, packed.pad_id, packed.device), chunk)
    mask = collate(data, rows, 0, torch.device("cpu")).response_mask
    torch.testing.assert_close(logp[mask], ref_logp[mask], rtol=1e-5, atol=1e-5)
    for g, ref in zip(grads, ref_grads):
        # fp32, summed in another order (per sample, or under a mask): a few 1e-6 apart at most.
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-5)
        assert float((g - ref).norm()) <= 1e-5 * float(ref.norm()) + 1e-8
    assert any(float(g.abs().max()) > 0 for g in ref_grads)


def later_sample_logp(learner: Learner, first: Sample, later: Sample, restart: bool = True) -> torch.Tensor:
    batch = collate_packed([first, later], [0, 1], learner.pad_id, learner.device)
    if not restart:  # one sequence over the whole row: what a leak across the boundary looks like
        batch.position_ids = torch.arange(batch.input_ids.shape[1]).unsqueeze(0)
        batch.segments = None
    learner.model.eval()
    with torch.no_grad():
        logp, _ = response_logprobs(learner.model, batch, chunk=0)
    return logp[1, -len(later.response_ids):]


@pytest.mark.parametrize("attn", ["sdpa", "eager", "varlen"])
def test_no_attention_across_the_samples_of_a_packed_row(attn, monkeypatch):
    learner = learner_for("llama", attn, pack=True)
    spans_run = []
    per_span = varlen._per_span
    monkeypatch.setattr(varlen, "_per_span", lambda *a: spans_run.append(1) or per_span(*a))
    data = samples()
    first, later = data[1], data[0]
    other = Sample([(t * 7 + 3) % VOCAB for t in first.prompt_ids], [(t * 5 + 1) % VOCAB for t in first.response_ids],
                   first.advantage)
    alone = collate([later], [0], learner.pad_id, learner.device)
    learner.model.eval()
    with torch.no_grad():
        alone_logp, _ = response_logprobs(learner.model, alone, chunk=0)
    # The later sample's log-probs do not depend on the sample before it in the row, and equal its own.
    torch.testing.assert_close(later_sample_logp(learner, first, later), alone_logp[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(later_sample_logp(learner, other, later), alone_logp[0], rtol=1e-5, atol=1e-5)
    # The check sees a leak: the same row read as one sequence gives other log-probs.
    assert bool(spans_run) == (attn == "varlen")  # kforge_varlen really ran attention per sample span
    leaked = later_sample_logp(learner, first, later, restart=False)
    assert float((leaked - alone_logp[0]).abs().max()) > 1e-3


def test_a_train_step_is_the_same_packed_and_padded():
    cfg = dict(learning_rate=1e-2, num_substeps=2, entropy_coef=0.01, micro_batch_tokens=30)
    padded = learner_for("qwen2", "sdpa", pack=False, **cfg)
    packed = learner_for("qwen2", "varlen", pack=True, **cfg)
    torch.manual_seed(0)
    a = padded.train_step(samples())
    torch.manual_seed(0)
    b = packed.train_step(samples())
    assert b["loss"] == pytest.approx(a["loss"], rel=1e-5, abs=1e-8)
    assert b["entropy"] == pytest.approx(a["entropy"], rel=1e-5)
    assert b["tokens"] == a["tokens"]  # real tokens, padding excluded, either way
    for p, q in zip(padded.params, packed.params):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6)


def test_varlen_leaves_padded_rows_and_generation_to_sdpa():
    model = small_model("llama", "sdpa")
    ref = small_model("llama", "sdpa")
    assert varlen.install(model) and model.config._attn_implementation == varlen.NAME
    assert not varlen.install(small_model("llama", "eager"))  # eager handles packed rows itself
    from transformers import MistralConfig, MistralForCausalLM

    windowed = MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                                                num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                                                sliding_window=8))
    assert not varlen.install(windowed)  # its windows come from sdpa's mask: left as it is
    data = samples()
    batch = collate(data, [0, 1, 2], 0, torch.device("cpu"))
    with torch.no_grad():
        out = model(**batch.model_inputs()).logits
        expected = ref(**batch.model_inputs()).logits
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        prompt = torch.tensor([data[0].prompt_ids])
        assert model.generate(prompt, max_new_tokens=5, do_sample=False).tolist() == \
            ref.generate(prompt, max_new_tokens=5, do_sample=False).tolist()


def test_spans_are_the_lengths_a_packed_row_carries():
    batch = collate_packed(samples(), [0, 1, 2], 0, torch.device("cpu"))
    cu, longest = varlen.spans(batch.model_inputs(), 1, torch.device("cpu"))
    assert cu.tolist() == batch.segments["cu_seq_lens_q"].tolist() and longest == batch.segments["max_length_q"]
    # Without them a row is one sequence, whatever its position_ids (transformers' own mask reads those).
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert varlen.spans({"position_ids": pos}, 1, torch.device("cpu")) is None


def _stand_in(signature: str):
    """A stand-in for torch's varlen_attn (CUDA only) in one of its two call forms, computing per span."""
    calls: list[dict] = []
    if signature == "old":  # torch 2.9: is_causal, no scale, no GQA
        def kernel(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=False, return_aux=None):
            assert k.shape[1] == q.shape[1] and is_causal
            calls.append(dict(is_causal=is_causal))
            return varlen._per_span(q, k, v, cu_q, None)
    else:
        def kernel(q, k, v, cu_q, cu_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1),
                   enable_gqa=False, seqused_k=None, block_table=None, num_splits=None):
            assert window_size == (-1, 0) and enable_gqa == (k.shape[1] != q.shape[1])
            calls.append(dict(scale=scale, window_size=window_size))
            return varlen._per_span(q, k, v, cu_q, scale)
    return kernel, calls


@pytest.mark.parametrize("signature", ["old", "new"])
def test_both_forms_of_torchs_varlen_kernel_get_a_causal_call_with_the_right_heads(signature, monkeypatch):
    kernel, calls = _stand_in(signature)
    monkeypatch.setattr(varlen, "_kernel", lambda q: kernel)
    data, rows = samples(), [0, 1, 2, 3, 4]
    padded = learner_for("llama", "sdpa", pack=False)
    packed = learner_for("llama", "varlen", pack=True)
    ref_logp, ref_grads = logp_and_grads(padded, collate(data, rows, padded.pad_id, padded.device), 0)
    logp, grads = logp_and_grads(packed, collate_packed(data, rows, packed.pad_id, packed.device), 0)
    assert calls  # the kernel ran (GQA: 4 query heads on 2 key/value heads)
    mask = collate(data, rows, 0, torch.device("cpu")).response_mask
    torch.testing.assert_close(logp[mask], ref_logp[mask], rtol=1e-5, atol=1e-5)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-5)


def test_the_mask_is_dropped_only_for_a_forward_without_padding_or_cache():
    from transformers.masking_utils import sdpa_mask

    assert varlen._mask(batch_size=1, q_length=6, kv_length=6, q_offset=0, kv_offset=0, attention_mask=None,
                        allow_is_causal_skip=False, device="cpu") is None
    # A cache (queries after position 0, keys longer than queries) keeps sdpa's mask, padding too.
    for args in (dict(q_length=2, kv_length=8, q_offset=4, attention_mask=None),
                 dict(q_length=6, kv_length=6, q_offset=0, attention_mask=torch.tensor([[0, 1, 1, 1, 1, 1]]))):
        args = dict(batch_size=1, kv_offset=0, allow_is_causal_skip=False, device="cpu", **args)
        expected = sdpa_mask(**args)
        assert expected is not None and torch.equal(varlen._mask(**args), expected)
