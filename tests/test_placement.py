"""The GPU planner for 1-8 GPUs (pure: a GPU count and memory in, a plan and its reasons out), and
`kforge train --dry-run`, which prints the plan and why and starts nothing."""

from __future__ import annotations

import pytest

from kforge.train.placement import Memory, PlacementError, plan_placement

GB_7B = 7.6e9 * 2 / 2**30  # Qwen2.5-Coder-7B in bf16, about 14 GiB
H100 = 79.6


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


@pytest.mark.parametrize("n", range(1, 9))
def test_every_gpu_has_a_role_and_timing_gets_a_gpu_of_its_own_from_three_on(n):
    plan = plan_placement(ids(n), memory=Memory(H100, GB_7B, GB_7B, 0.5))
    used = set(plan.rollout) | set(plan.learner) | set(plan.eval)
    assert used == set(range(n))  # no idle GPU (eight GPUs used to give six to a pool that needs one)
    assert plan.rollout == [0]  # a 7B model fits one GPU: no tensor parallel
    if n == 1:
        assert plan.mode == "shared" and plan.learner == plan.eval == [0]
    elif n == 2:
        assert (plan.learner, plan.eval) == ([1], [1])
    else:
        assert plan.eval == [n - 1] and plan.learner == list(range(1, n - 1))
        assert not set(plan.eval) & (set(plan.learner) | set(plan.rollout))
        assert any("of its own" in line for line in plan.why)
    if len(plan.learner) > 1:
        assert any(f"{len(plan.learner)} data-parallel rank(s)" in line for line in plan.why)
    text = plan.explain()
    assert text.startswith("placement [") and text.count("\n") == len(plan.why) >= 2


def test_tensor_parallel_only_when_the_weights_do_not_fit_one_gpu_and_said_so():
    big = 32.8e9 * 2 / 2**30  # a 32B model: over one H100's half, under two
    plan = plan_placement(ids(4), memory=Memory(H100, big, big, 0.5))
    assert (plan.rollout, plan.learner, plan.eval) == ([0, 1], [2], [3])
    assert any("tensor parallel over GPUs 0-1" in line and "do not fit" in line for line in plan.why)
    plan = plan_placement(ids(2), memory=Memory(H100, big, big, 0.5))
    assert plan.rollout == plan.learner == plan.eval == [0, 1] and plan.mode == "shared"
    with pytest.raises(PlacementError, match=r"needs 2 GPUs .* 1 GPU\(s\) are visible"):
        plan_placement(ids(1), memory=Memory(H100, big, big, 0.5))


def test_a_plan_the_gpus_cannot_hold_is_refused_in_one_line():
    huge = 70e9 * 2 / 2**30  # 70B in bf16: the learner's copy alone is over an H100
    with pytest.raises(PlacementError, match="model.load_in_4bit=true") as info:
        plan_placement(ids(8), memory=Memory(H100, huge, huge, 0.5))
    assert "\n" not in str(info.value)
    quarter = 70e9 * 0.55 / 2**30  # with the learner in 4 bits it fits; the engine needs all 8
    plan = plan_placement(ids(8), memory=Memory(H100, huge, quarter, 0.5))
    assert plan.rollout == list(range(8)) and plan.mode == "shared"
    with pytest.raises(PlacementError, match="needs 8 GPUs"):
        plan_placement(ids(4), memory=Memory(H100, huge, quarter, 0.5))


def test_unknown_size_is_said_and_overrides_still_win():
    plan = plan_placement(ids(4))
    assert any("assumed to fit" in line for line in plan.why)
    plan = plan_placement(ids(4), {"eval": [1], "learner": [1, 2, 3]}, Memory(H100, GB_7B, GB_7B))
    assert (plan.rollout, plan.learner, plan.eval) == ([0], [1, 2, 3], [1])
    assert any("set by --gpus" in line for line in plan.why) and any("skewed" in line for line in plan.why)


def test_train_dry_run_prints_the_plan_and_why_and_starts_nothing(tmp_path, monkeypatch):
    """A pretend 4 x H100 machine and a 7B-shaped config (no weights): the plan with its reasons, exit 0, and
    no run folder."""
    from transformers import Qwen2Config
    from typer.testing import CliRunner

    from fake_parts import fake_machine

    from kforge.cli.app import app
    from kforge.train import placement

    Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False).save_pretrained(tmp_path / "m")
    listing = fake_machine(monkeypatch, 4, memory_mb=81559)
    monkeypatch.setattr(placement, "query_gpus", lambda: (list(listing), "nvidia-smi"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runs = tmp_path / "runs"
    result = CliRunner().invoke(app, ["train", "--preset", "tiny", "--dry-run", "--runs-dir", str(runs),
                                      f"model.name={tmp_path / 'm'}", "model.gguf_file=null"])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "placement [split]: rollout=GPU 0  learner=GPU 1,2  eval=GPU 3" in out, out
    assert "2 data-parallel rank(s)" in out and "eval on GPU 3 of its own" in out
    assert "assumed to fit" not in out  # the size was counted from the config
    assert not runs.exists()
