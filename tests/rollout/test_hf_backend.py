"""The transformers backend on CPU with the real SmolLM2-135M: batching, log-probs against a plain forward
pass, stop strings, LoRA adapter hot-load. The model loads once for the module (~25 s)."""

from __future__ import annotations

import asyncio
import copy

import pytest
import torch

from kforge.rollout.base import BackendError, GenerationRequest, SamplingParams
from kforge.rollout.factory import choose_backend, vllm_available
from kforge.rollout.logprobs import process_logits, sampled_logprobs
from smollm import load_smollm

QUESTIONS = [
    "Write a Triton kernel that adds two vectors.",
    "What is a GPU warp?",
    "Name one way to make a matrix multiplication faster on a GPU, and explain why it helps in two sentences.",
]


def chat_ids(tok, question: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": question}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def forward_logits(model, prompt: list[int], response: list[int]) -> torch.Tensor:
    """Logits that predict each response token, from one unpadded forward pass."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0]
    return logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]


@pytest.fixture(scope="module")
def smollm():
    return load_smollm()


@pytest.fixture(scope="module")
def backend(smollm):
    from kforge.rollout.hf import HFBackend

    model, tok = smollm
    return HFBackend.from_model(model, tok, batch_size=2)


@pytest.fixture(scope="module")
def prompts(smollm):
    return [chat_ids(smollm[1], q) for q in QUESTIONS]


def test_process_logits_matches_transformers_warpers():
    """Our temperature / top-k / top-p processing is the one transformers (and vLLM) sample with."""
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    torch.manual_seed(0)
    logits = torch.randn(4, 500) * 3
    ids = torch.zeros(4, 1, dtype=torch.long)
    for temperature, top_k, top_p in [(0.7, -1, 1.0), (1.0, 20, 1.0), (0.9, -1, 0.8), (1.3, 50, 0.9)]:
        ref = TemperatureLogitsWarper(temperature)(ids, logits.clone())
        if top_k > 0:
            ref = TopKLogitsWarper(top_k)(ids, ref)
        if top_p < 1.0:
            ref = TopPLogitsWarper(top_p)(ids, ref)
        ours = process_logits(logits, temperature, top_k, top_p)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
        finite = ~torch.isinf(ref)
        assert torch.allclose(ours[finite], ref[finite], atol=1e-6)
        tokens = torch.randint(0, 500, (4,))
        lp = sampled_logprobs(logits, tokens, temperature, top_k, top_p)
        assert torch.allclose(lp, ref.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))


def test_choose_backend_here():
    assert choose_backend("hf") == "hf"
    if not torch.cuda.is_available():
        assert choose_backend("auto") == "hf"
    if not vllm_available():
        with pytest.raises(BackendError, match="not installed"):
            choose_backend("vllm")


@pytest.mark.slow
def test_sampled_logprobs_match_a_forward_pass(smollm, backend, prompts):
    model, tok = smollm
    params = SamplingParams(max_tokens=10, temperature=0.7, seed=3)
    outs = backend.generate([GenerationRequest(p, params) for p in prompts])  # 2 batches, left padded
    assert len(outs) == 3
    for prompt, out in zip(prompts, outs):
        assert 1 <= len(out.token_ids) <= 10 and len(out.logprobs) == len(out.token_ids)
        assert out.finish_reason in ("stop", "length")
        assert out.finish_reason == "length" or out.token_ids[-1] == tok.eos_token_id
        assert out.text == tok.decode(out.token_ids, skip_special_tokens=True)
        expected = sampled_logprobs(forward_logits(model, prompt, out.token_ids), torch.tensor(out.token_ids), 0.7)
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-3), (out.logprobs, expected.tolist())
        assert all(lp <= 0.0 for lp in out.logprobs)


@pytest.mark.slow
def test_top_k_top_p_logprobs_are_those_of_the_truncated_distribution(smollm, backend, prompts):
    model, _ = smollm
    params = SamplingParams(max_tokens=8, temperature=1.0, top_k=20, top_p=0.9, seed=7)
    (out,) = backend.generate([GenerationRequest(prompts[1], params)])
    logits = forward_logits(model, prompts[1], out.token_ids)
    expected = sampled_logprobs(logits, torch.tensor(out.token_ids), 1.0, 20, 0.9)
    assert torch.allclose(torch.tensor(out.logprobs), expected, atol=1e-3)
    kept = torch.isfinite(process_logits(logits, 1.0, 20, 0.9))
    assert all(kept[i, t] for i, t in enumerate(out.token_ids))  # every token came from the nucleus


@pytest.mark.slow
def test_greedy_is_deterministic_and_stop_strings_end_the_text(smollm, backend, prompts):
    model, tok = smollm
    greedy = SamplingParams(max_tokens=12, temperature=0.0)
    first = backend.generate([GenerationRequest(prompts[0], greedy)])[0]
    again = backend.generate([GenerationRequest(prompts[0], greedy)])[0]
    assert first.token_ids == again.token_ids
    # Greedy log-probs are those of the raw distribution (temperature 0 counts as 1).
    raw = forward_logits(model, prompts[0], first.token_ids).log_softmax(-1)
    chosen = raw.gather(-1, torch.tensor(first.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(first.logprobs), chosen, atol=1e-3)
    assert all(raw[i].argmax().item() == t for i, t in enumerate(first.token_ids))
    # A stop string taken from the middle of the greedy text ends generation right after it appears.
    words = first.text.split()
    assert len(words) >= 3, first.text
    stop = words[len(words) // 2]
    stopped = backend.generate([GenerationRequest(prompts[0], SamplingParams(max_tokens=12, temperature=0.0, stop=[stop]))])[0]
    assert stopped.finish_reason == "stop" and stop in stopped.text
    assert stop not in tok.decode(stopped.token_ids[:-1])
    assert stopped.token_ids == first.token_ids[: len(stopped.token_ids)]
    assert len(stopped.token_ids) < len(first.token_ids)


@pytest.mark.slow
def test_a_seeded_request_samples_the_same_tokens_whatever_its_batch(smollm, prompts):
    """Without a turn barrier, which requests share a batch depends on when verdicts come back; a request's
    own seed decides its tokens (each row samples from its own generator), so the batch does not."""
    from kforge.rollout.hf import HFBackend

    model, _ = smollm
    wide = HFBackend.from_model(model, smollm[1], batch_size=3)
    params = lambda seed: SamplingParams(max_tokens=8, temperature=1.0, seed=seed)  # noqa: E731
    alone = wide.generate([GenerationRequest(prompts[1], params(11))])[0]
    together = wide.generate([GenerationRequest(prompts[0], params(5)), GenerationRequest(prompts[1], params(11)),
                              GenerationRequest(prompts[2], params(6))])
    assert together[1].token_ids == alone.token_ids
    assert torch.allclose(torch.tensor(together[1].logprobs), torch.tensor(alone.logprobs), atol=1e-4)
    others = wide.generate([GenerationRequest(prompts[1], params(seed)) for seed in (12, 13, 14)])
    assert any(o.token_ids != alone.token_ids for o in others)  # the seed, not the prompt alone, decides


@pytest.mark.slow
def test_agenerate_reports_each_completion(backend, prompts):
    seen: list[int] = []
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=1)

    async def main():
        return await backend.agenerate([GenerationRequest(p, params) for p in prompts], lambda i, c: seen.append(i))

    outs = asyncio.run(main())
    assert sorted(seen) == [0, 1, 2] and len(outs) == 3 and all(o.token_ids for o in outs)


@pytest.mark.slow
def test_lora_adapter_hot_load_changes_outputs(smollm, backend, prompts, tmp_path):
    from peft import LoraConfig, get_peft_model

    model, tok = smollm
    greedy = SamplingParams(max_tokens=5, temperature=0.0)
    requests = [GenerationRequest(p, greedy) for p in prompts[:2]]
    base = backend.generate(requests)

    # Two adapters with nonzero random weights, written by PEFT (on a copy: get_peft_model edits in place).
    folders = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        cfg = LoraConfig(r=8, lora_alpha=64, target_modules=["q_proj", "v_proj"], init_lora_weights=False, task_type="CAUSAL_LM")
        peft_model = get_peft_model(copy.deepcopy(model), cfg)
        folder = tmp_path / f"adapter{seed}"
        peft_model.save_pretrained(str(folder))
        folders.append(folder)
        if seed == 1:  # a shared learner PEFT model has live weights: loading only records the version
            from kforge.rollout.hf import HFBackend

            shared = HFBackend.from_model(peft_model, tok)
            shared.load_adapter(str(folder), 5)
            assert shared.live_weights and shared.version == 5 and shared.model is peft_model
        del peft_model

    try:
        backend.load_adapter(str(folders[0]), 1)
        assert backend.version == 1
        tuned = backend.generate(requests)
        assert [o.token_ids for o in tuned] != [o.token_ids for o in base]
        # Log-probs are those of the adapted model.
        logits = forward_logits(backend.model, prompts[0], tuned[0].token_ids)
        expected = logits.log_softmax(-1).gather(-1, torch.tensor(tuned[0].token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(tuned[0].logprobs), expected, atol=1e-3)

        backend.load_adapter(str(folders[1]), 2)  # the next policy version replaces the first
        assert backend.version == 2 and len(backend.model.peft_config) == 1
        second = backend.generate(requests)
        assert [o.token_ids for o in second] != [o.token_ids for o in tuned]
        backend.load_adapter(str(folders[0]), 3)  # reloading the first brings its outputs back
        assert [o.token_ids for o in backend.generate(requests)] == [o.token_ids for o in tuned]

        with pytest.raises(BackendError, match="adapter_config.json"):
            backend.load_adapter(str(tmp_path), 4)
    finally:
        backend.unload_adapter()
    assert [o.token_ids for o in backend.generate(requests)] == [o.token_ids for o in base]
