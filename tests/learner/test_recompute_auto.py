"""`model.recompute_share=auto`: the estimate against the measured peaks, and the share it picks."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from kforge.config.schema import KforgeConfig
from kforge.learner.recompute import GIB, Shape, choose_for, choose_share, peak_bytes

# The Qwen2.5-Coder shapes of bench/learner.py; weights counted from the bf16 models, LoRA r32 on every linear.
SEVEN_B = Shape(layers=28, hidden=3584, intermediate=18944, vocab=152064, weight_bytes=15_231_233_024,
                lora_params=80_740_352)
ONE_FIVE_B = Shape(layers=28, hidden=1536, intermediate=8960, vocab=151936, weight_bytes=3_087_428_608,
                   lora_params=36_929_536)
H100 = int(79.1 * GIB)  # what torch reports for an H100 80GB
H200 = int(139.8 * GIB)


def gib(shape: Shape, share: float, tokens: int, chunk: int = 1024, autocast: bool = True) -> float:
    return peak_bytes(shape, round(share * shape.layers), tokens, chunk, autocast) / GIB


@pytest.mark.parametrize("share, tokens, autocast, measured", [
    (0.25, 8192, True, 52.6),  # H100 80GB, packed rows
    (1.0, 16384, True, 24.8),  # H100 80GB
    (0.25, 8192, True, 53.4),  # H200
    (0.25, 8192, False, 70.9),  # H200, PEFT's fp32 copies of the LoRA inputs kept
])
def test_the_estimate_covers_each_measured_peak_by_at_most_3_gib(share, tokens, autocast, measured):
    assert measured <= gib(SEVEN_B, share, tokens, autocast=autocast) <= measured + 3.0


def test_the_row_that_ran_out_of_memory_is_estimated_over_the_gpu():
    assert gib(SEVEN_B, 0.25, 16384) > H100 / GIB  # H100 80GB: out of memory at 16384 tokens, share 0.25


def test_auto_picks_by_the_measurements():
    at_8k = choose_share(SEVEN_B, 8192, 1024, H100)
    assert at_8k.fits and at_8k.share <= 0.25  # 0.25 ran at 52.6 GiB: less recompute fits too
    at_16k = choose_share(SEVEN_B, 16384, 1024, H100)
    assert at_16k.fits and 0.25 < at_16k.share < 1.0  # 0.25 ran out of memory, 1 left 55 GiB unused
    assert at_16k.estimate_bytes <= 0.9 * H100 < peak_bytes(SEVEN_B, round(at_16k.share * 28) - 1, 16384, 1024)
    assert choose_share(ONE_FIVE_B, 16384, 1024, H100).share == 0.0
    assert "14 of 28 layers recompute" in choose_share(SEVEN_B, 16384, 1024, H100, 3 * GIB).why
    # Without autocast (PEFT's fp32 copies of the LoRA inputs) the same row needs more recompute.
    assert choose_share(SEVEN_B, 16384, 1024, H100, autocast=False).share > at_16k.share
    assert choose_share(SEVEN_B, 16384, 1024, H200).share < at_16k.share


def test_auto_never_recomputes_less_for_more_tokens_or_less_memory():
    def share(tokens: int, gpu: float, reserve: float) -> float:
        return choose_share(SEVEN_B, tokens, 1024, int(gpu * GIB), int(reserve * GIB)).share

    rows = [2048 * k for k in range(1, 65)]
    by_tokens = [share(t, 79.1, 0) for t in rows]
    assert by_tokens == sorted(by_tokens) and by_tokens[0] == 0.0 and by_tokens[-1] > 0.9 and len(set(by_tokens)) > 10
    by_memory = [share(16384, g, 0) for g in (140, 120, 100, 80, 70, 60, 50)]
    assert by_memory == sorted(by_memory) and len(set(by_memory)) > 3
    by_reserve = [share(16384, 79.1, r) for r in range(0, 30, 3)]
    assert by_reserve == sorted(by_reserve) and by_reserve[-1] > by_reserve[0]


def test_when_even_full_recompute_does_not_fit_it_says_so_and_names_the_knob():
    choice = choose_share(SEVEN_B, 16384, 1024, int(24 * GIB))
    assert (choice.share, choice.fits) == (1.0, False)
    assert choice.estimate_bytes > 0.9 * 24 * GIB
    assert "learner.micro_batch_tokens" in choice.why and "\n" not in choice.why
    assert choose_share(SEVEN_B, 16384, 1024, int(30 * GIB)).fits  # 26.3 GiB at share 1 fits 0.9 x 30


def cfg_with(share, **learner) -> KforgeConfig:
    cfg = KforgeConfig()
    cfg.model.recompute_share = share
    for key, value in learner.items():
        setattr(cfg.learner, key, value)
    return cfg


def tiny_llama(layers: int = 4):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=40, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2))


def test_the_learner_sizes_auto_by_its_gpu_and_the_longest_row(monkeypatch):
    model = tiny_llama().requires_grad_(False)  # all of it counted as base weights
    cfg = cfg_with("auto", micro_batch_tokens=1000, bf16_autocast=True)
    cfg.model.max_model_len = 2000  # a sample of 2000 tokens has a row of its own
    shape = Shape(4, 32, 64, 40, sum(p.numel() * p.element_size() for p in model.parameters()), 0)
    # A GPU with room for the weights and 2 of the 4 layers' activations at 2000 tokens.
    room = peak_bytes(shape, 2, 2000, 1024)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=int(room / 0.9) + 2))
    choice = choose_for(model, cfg, torch.device("cuda"))
    assert choice.share == 0.5 and choice.estimate_bytes == room and "2000 tokens" in choice.why
    assert choose_for(model, cfg, torch.device("cuda"), reserve_gib=room / GIB / 4).share > 0.5
    assert choose_for(model, cfg, torch.device("cpu")).share == 1.0  # nothing to fit on the CPU
    assert choose_for(model, cfg_with(0.25), torch.device("cuda")).share == 0.25  # a number is used as it is


def test_the_learner_applies_auto_and_says_why(caplog):
    from kforge.learner.lora import checkpointed_layers
    from tiny_models import make_learner

    cfg = cfg_with("auto")
    cfg.lora.rank = 4
    with caplog.at_level("INFO", logger="kforge.learner"):
        learner = make_learner(cfg, model=tiny_llama(), total_steps=1)
    assert len(checkpointed_layers(learner.model)) == 4 and learner.recompute.share == 1.0
    assert "recompute_share auto: no CUDA device" in caplog.text


@pytest.mark.parametrize("value, ok", [("auto", "auto"), (0.25, 0.25), ("0.5", 0.5), (1, 1.0), (0, 0.0)])
def test_the_config_takes_a_share_or_auto(value, ok):
    assert KforgeConfig.model_validate({"model": {"recompute_share": value}}).model.recompute_share == ok


@pytest.mark.parametrize("value", ["bogus", "1.5", "-0.1", "nan", "null", "true"])
def test_the_config_refuses_anything_else_in_one_line(value):
    from kforge.config.loader import ConfigError, resolve

    with pytest.raises(ConfigError) as caught:
        resolve(overrides=[f"model.recompute_share={value}"])
    message = str(caught.value)
    assert "model.recompute_share" in message and "auto" in message and "\n" not in message


def test_the_reserve_is_what_the_plan_puts_beside_the_learner(monkeypatch):
    from fake_parts import fake_machine, fake_served
    from kforge.rollout.base import SamplingParams
    from kforge.train import learner_proc
    from kforge.train.placement import Plan

    alone = Plan(["0"], rollout=[0], learner=[0], eval=[0])  # one GPU: a sleeping engine and 2 eval workers
    assert alone.learner_reserve_gib(eval_workers_per_gpu=2) == 3.0 + 2 * 1.0
    assert Plan(["0", "1", "2"], rollout=[0], learner=[1], eval=[2]).learner_reserve_gib(2) == 0.0
    assert Plan(["0", "1"], rollout=[0], learner=[1], eval=[0, 1]).learner_reserve_gib(2) == 2.0
    assert Plan([]).learner_reserve_gib(2) == 0.0
    fake_machine(monkeypatch, 1)
    started: list = []
    monkeypatch.setattr(learner_proc, "ServedProcess", fake_served(started))
    learner_proc.LearnerProcess(KforgeConfig(), [0], sampling=SamplingParams(), reserve_gib=5.0)
    assert started[0]["kwargs"]["reserve_gib"] == 5.0  # to LearnerService, which hands it to the Learner
