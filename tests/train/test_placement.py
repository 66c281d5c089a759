"""The GPU planner for 1-8 GPUs (pure: a GPU count and memory in, a plan and its reasons out), and
`kforge train --dry-run`, which prints the plan and why and starts nothing."""

from __future__ import annotations

import pytest

from kforge.train.placement import Memory, PlacementError, plan_placement

GB_7B = 7.6e9 * 2 / 2**30  # Qwen2.5-Coder-7B in bf16, about 14 GiB
GB_135M = 0.135e9 * 2 / 2**30  # SmolLM2-135M in bf16
H100, RTX = 79.6, 24.0


def ids(n: int) -> list[str]:
    return [str(i) for i in range(n)]


@pytest.mark.parametrize("n", range(1, 9))
@pytest.mark.parametrize("gb", [GB_135M, GB_7B], ids=["135M", "7B"])
def test_colocated_when_memory_allows_one_engine_and_one_rank_per_compute_gpu(n, gb):
    """80 GB GPUs hold a 7B learner copy (14 GB) beside the engine's half: every compute GPU gets an engine
    replica and a learner rank, and the eval pool a GPU of its own from 3 on."""
    plan = plan_placement(ids(n), memory=Memory(H100, gb, gb, 0.5))
    compute = list(range(n)) if n <= 2 else list(range(n - 1))
    assert plan.mode == "colocated"
    assert (plan.rollout, plan.learner, plan.rollout_tp, plan.engines) == (compute, compute, 1, len(compute))
    assert plan.eval == (compute if n <= 2 else [n - 1])
    assert set(plan.rollout) | set(plan.learner) | set(plan.eval) == set(range(n))  # no idle GPU
    assert "fit 90% of a GPU" in plan.why[0] and "sleep" in plan.why[0]
    if n >= 3:
        assert any(f"eval on GPU {n - 1} of its own" in line for line in plan.why)
    if len(compute) > 1:
        assert any(f"{len(compute)} data-parallel engines" in line for line in plan.why)
        assert any(f"{len(compute)} data-parallel ranks" in line for line in plan.why)
        assert f"({len(compute)} engines capped and slept" in plan.describe()
    text = plan.explain()
    assert text.startswith("placement [colocated]: ") and text.count("\n") == len(plan.why) >= 4


def test_the_memory_rule_is_the_learner_copy_plus_the_engine_share_within_90_percent():
    assert Memory(H100, GB_7B, GB_7B, 0.5).colocates()  # 14 + 40 <= 72
    assert not Memory(H100, GB_7B, GB_7B, 0.75).colocates()  # 14 + 60 > 72
    assert not Memory(RTX, GB_7B, GB_7B, 0.5).colocates()  # 14 + 12 > 21.6
    assert Memory(RTX, GB_7B, 0.55 * 7.6e9 / 2**30, 0.5).colocates()  # a 4-bit learner: 4 + 12 <= 21.6
    assert Memory(H100).colocates() is None and Memory(None, GB_7B, GB_7B).colocates() is None
    # The share that would colocate is offered only where it still holds the engine's weights.
    assert Memory(H100, GB_7B, GB_7B, 0.75).colocating_share(1) == 0.72
    assert Memory(RTX, GB_7B, GB_7B, 0.5).colocating_share(1) == 0.0  # 0.31 x 24 GB cannot hold 14 GB
    assert Memory(RTX, GB_7B, GB_7B, 0.5).colocating_share(2) == 0.0
    assert Memory(RTX, GB_7B, GB_7B, 0.5).colocating_share(4) == 0.31  # tensor parallel over four it can
    plan = plan_placement(ids(4), memory=Memory(H100, GB_7B, GB_7B, 0.75))
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("split", [0, 1], [2], [3])
    assert "rollout.gpu_memory_utilization=0.72 would colocate them" in plan.why[0]


@pytest.mark.parametrize("n", range(1, 9))
def test_a_7b_model_on_24gb_gpus_is_split_from_three_gpus_and_refused_below(n):
    """14 GB of learner weights beside half of a 24 GB GPU is over the rule: split, with the engine tensor
    parallel over 2 GPUs (its weights overflow half a GPU) and the larger half of the compute GPUs to the
    engines; one or two GPUs cannot hold the two apart and are refused in one line saying what to do."""
    mem = Memory(RTX, GB_7B, GB_7B, 0.5)
    if n <= 2:
        with pytest.raises(PlacementError) as info:
            plan_placement(ids(n), memory=mem)
        assert "\n" not in str(info.value)
        assert ("needs 2 GPUs" if n == 1 else "rollout.gpu_memory_utilization=0.9 (split") in str(info.value)
        return
    plan = plan_placement(ids(n), memory=mem)
    assert plan.mode == "split" and plan.rollout_tp == 2 and plan.why[0].startswith("split: ")
    want = {3: ([0, 1], [2], [2]), 4: ([0, 1], [2], [3]), 5: ([0, 1], [2, 3], [4]), 6: ([0, 1, 2, 3], [4], [5]),
            7: ([0, 1, 2, 3], [4, 5], [6]), 8: ([0, 1, 2, 3], [4, 5, 6], [7])}
    assert (plan.rollout, plan.learner, plan.eval) == want[n]
    assert any("tensor parallel" in line and "do not fit one GPU's share (0.5 x 24 GB)" in line for line in plan.why)


@pytest.mark.parametrize("n", range(2, 9))
def test_split_from_three_gpus_gives_the_engines_the_larger_half(n):
    """Split by memory (a share too large to colocate), engines of one GPU each: the rollout is most of a
    step, so data-parallel engines take the larger half of the compute GPUs, one at least to the learner."""
    plan = plan_placement(ids(n), memory=Memory(H100, GB_7B, GB_7B, 0.8))
    m = 2 if n == 2 else n - 1
    engines = max(1, min((m + 1) // 2, m - 1))
    assert plan.mode == "split" and plan.rollout == list(range(engines))
    assert plan.learner == list(range(engines, m)) and plan.eval == ([1] if n == 2 else [n - 1])
    assert engines == {2: 1, 3: 1, 4: 2, 5: 2, 6: 3, 7: 3, 8: 4}[n]
    if n >= 4:
        assert any("larger half" in line for line in plan.why)


@pytest.mark.parametrize("n", range(1, 9))
def test_pipelined_rollouts_are_split_and_refused_where_they_cannot_be(n):
    """rollout.max_staleness=1 overlaps the next step's rollouts with the learner's step: the planner splits
    (even where memory would colocate); one GPU cannot, and says so in one line; overrides that put the
    engine and the learner on one GPU are refused too."""
    mem = Memory(H100, GB_7B, GB_7B, 0.5)
    if n == 1:
        with pytest.raises(PlacementError, match=r"max_staleness=1 .* set rollout.max_staleness=0") as info:
            plan_placement(ids(1), memory=mem, pipelined=True)
        assert "\n" not in str(info.value)
        return
    plan = plan_placement(ids(n), memory=mem, pipelined=True)
    assert plan.mode == "split" and "max_staleness=1" in plan.why[0]
    assert not set(plan.rollout) & set(plan.learner)
    with pytest.raises(PlacementError, match=r"--gpus / placement.\* put the engine and the learner on the same GPU"):
        plan_placement(ids(n), {"rollout": [0], "learner": [0]}, mem, pipelined=True)


def test_tensor_parallel_only_when_the_weights_do_not_fit_one_gpu_and_said_so():
    big = 32.8e9 * 2 / 2**30  # a 32B model: over one H100's half, under two; its learner copy beside it: over
    plan = plan_placement(ids(4), memory=Memory(H100, big, big, 0.5))
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("split", [0, 1], [2], [3])
    assert any("tensor parallel over GPUs 0-1" in line and "do not fit" in line for line in plan.why)
    with pytest.raises(PlacementError, match=r"2 GPU\(s\) cannot hold them apart \(the engine needs 2\)"):
        plan_placement(ids(2), memory=Memory(H100, big, big, 0.5))
    with pytest.raises(PlacementError, match=r"needs 2 GPUs .* 1 GPU\(s\) are visible"):
        plan_placement(ids(1), memory=Memory(H100, big, big, 0.5))
    quarter = 32.8e9 * 0.55 / 2**30  # a 4-bit learner (17 GB) fits beside the share: colocated, 2 GPUs an engine
    plan = plan_placement(ids(8), memory=Memory(H100, big, quarter, 0.5))
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("colocated", list(range(6)), list(range(7)), [7])
    assert plan.engines == 3 and any("3 data-parallel engines, each tensor parallel over 2 GPUs" in line
                                     for line in plan.why)


def test_a_plan_the_gpus_cannot_hold_is_refused_in_one_line():
    huge = 70e9 * 2 / 2**30  # 70B in bf16: the learner's copy alone is over an H100
    with pytest.raises(PlacementError, match="model.load_in_4bit=true") as info:
        plan_placement(ids(8), memory=Memory(H100, huge, huge, 0.5))
    assert "\n" not in str(info.value)
    quarter = 70e9 * 0.55 / 2**30  # with the learner in 4 bits (36 GB) it fits a GPU; the engine needs all 8
    with pytest.raises(PlacementError, match=r"8 GPU\(s\) cannot hold them apart \(the engine needs 8\): set "
                                             r"rollout.gpu_memory_utilization=0.44 \(colocated\)"):
        plan_placement(ids(8), memory=Memory(H100, huge, quarter, 0.5))  # 36 + 40 GB over 90% of 80
    plan = plan_placement(ids(8), memory=Memory(H100, huge, quarter, 0.44))
    assert plan.rollout == plan.learner == plan.eval == list(range(8)) and plan.mode == "colocated"
    assert any("every GPU serves the engine" in line for line in plan.why)
    with pytest.raises(PlacementError, match="needs 8 GPUs"):
        plan_placement(ids(4), memory=Memory(H100, huge, quarter, 0.5))
    # One GPU and a share too large to colocate: the share that would, in one line.
    with pytest.raises(PlacementError, match=r"set rollout.gpu_memory_utilization=0.72 \(colocated\) or "
                                             r"model.load_in_4bit=true") as info:
        plan_placement(ids(1), memory=Memory(H100, GB_7B, GB_7B, 0.8))
    assert "\n" not in str(info.value)


def test_unknown_size_is_said_and_assumed_to_colocate():
    plan = plan_placement(ids(4))
    assert plan.mode == "colocated" and (plan.rollout, plan.learner, plan.eval) == ([0, 1, 2], [0, 1, 2], [3])
    assert "size unknown" in plan.why[0] and "assumed" in plan.why[0]
    assert not any("size unknown" in line for line in plan_placement(ids(4), memory=Memory(H100, GB_7B, GB_7B)).why)


def test_overrides_win_and_naming_one_role_gives_the_other_the_compute_gpus_left():
    mem = Memory(H100, GB_7B, GB_7B, 0.5)
    plan = plan_placement(ids(4), {"eval": [1], "learner": [1, 2, 3]}, mem)
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("split", [0], [1, 2, 3], [1])
    assert any("set by --gpus" in line for line in plan.why) and any("skewed" in line for line in plan.why)
    plan = plan_placement(ids(4), {"rollout": [0]}, mem)  # as before the colocated default: a split
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("split", [0], [1, 2], [3])
    assert any("learner on GPU 1,2: the compute GPUs the rollout leaves" in line for line in plan.why)
    plan = plan_placement(ids(8), {"rollout": [0, 1, 2, 3]}, mem)
    assert (plan.rollout, plan.learner, plan.eval) == ([0, 1, 2, 3], [4, 5, 6], [7])
    assert any("4 data-parallel engines" in line for line in plan.why)
    plan = plan_placement(ids(4), {"learner": [0, 1, 2]}, mem)  # none left: the engines share its GPUs
    assert (plan.mode, plan.rollout, plan.learner) == ("colocated", [0, 1, 2], [0, 1, 2])
    plan = plan_placement(ids(4), {"rollout": [0, 1], "learner": [0, 1], "eval": [2, 3]}, mem)
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("colocated", [0, 1], [0, 1], [2, 3])
    # An override that colocates what memory cannot hold together is refused like the default would be.
    with pytest.raises(PlacementError, match="put the engine and the learner on the same GPU"):
        plan_placement(ids(4), {"rollout": [0], "learner": [0, 1]}, Memory(RTX, GB_7B, GB_7B, 0.9))


DRY_RUN = {
    1: ("placement [colocated]: rollout=GPU 0  learner=GPU 0  eval=GPU 0 (the engine capped and slept",
        "rollout: one engine on GPU 0"),
    2: ("placement [colocated]: rollout=GPU 0,1  learner=GPU 0,1  eval=GPU 0,1 (2 engines",
        "2 data-parallel ranks on GPU 0,1"),
    4: ("placement [colocated]: rollout=GPU 0,1,2  learner=GPU 0,1,2  eval=GPU 3 (3 engines",
        "eval on GPU 3 of its own"),
    8: ("placement [colocated]: rollout=GPU 0,1,2,3,4,5,6  learner=GPU 0,1,2,3,4,5,6  eval=GPU 7 (7 engines",
        "7 data-parallel engines, one per GPU 0,1,2,3,4,5,6"),
}


@pytest.mark.parametrize("n", sorted(DRY_RUN))
def test_train_dry_run_prints_the_plan_and_why_and_starts_nothing(tmp_path, monkeypatch, n):
    """A pretend machine of n H100s and a 7B-shaped config (an empty weights file): the plan with its reasons, exit 0,
    and no run folder; with rollout.max_staleness=1 a split, or on one GPU the one-line refusal (exit 2)."""
    from transformers import Qwen2Config
    from typer.testing import CliRunner

    from fake_parts import fake_machine
    from kforge.cli.app import app
    from kforge.train import placement

    Qwen2Config(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False).save_pretrained(tmp_path / "m")
    (tmp_path / "m" / "model.safetensors").write_bytes(b"")  # the pre-flight's model row asks for weights
    listing = fake_machine(monkeypatch, n, memory_mb=81559)
    monkeypatch.setattr(placement, "query_gpus", lambda: (list(listing), "nvidia-smi"))
    monkeypatch.setattr(placement, "_host_gb", lambda: 512.0)  # a workstation's RAM, not this test machine's
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    runs = tmp_path / "runs"
    args = ["train", "--preset", "tiny", "--dry-run", "--runs-dir", str(runs), f"model.name={tmp_path / 'm'}",
            "model.gguf_file=null", "model.dtype=bfloat16"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    out = result.output
    head, reason = DRY_RUN[n]
    assert head in out and reason in out, out
    assert "fit 90% of a GPU" in out and "about 14 GB" in out  # the size was counted from the config
    assert "assumed" not in out
    result = CliRunner().invoke(app, args + ["rollout.max_staleness=1"])
    if n == 1:
        assert result.exit_code == 2 and "set rollout.max_staleness=0" in result.output
        assert "Traceback" not in result.output
    else:
        split = {2: "rollout=GPU 0  learner=GPU 1  eval=GPU 1", 4: "rollout=GPU 0,1  learner=GPU 2  eval=GPU 3",
                 8: "rollout=GPU 0,1,2,3  learner=GPU 4,5,6  eval=GPU 7"}[n]
        assert result.exit_code == 0 and f"placement [split]: {split}\n" in result.output, result.output
    assert not runs.exists()


def test_slept_engines_must_fit_host_ram_or_the_plan_splits():
    """Asleep, every engine keeps its weights in host RAM: seven 7B engines (about 99 GB) do not fit 70% of a
    64 GB host, so 8 GPUs split; 512 GB hold them; one GPU cannot split and colocates with a warning."""
    short = plan_placement(ids(8), memory=Memory(H100, GB_7B, GB_7B, 0.5, host_gb=64))
    assert short.mode == "split" and short.eval == [7]
    assert short.why[0].startswith("split: 7 slept engine(s) would keep about 99 GB of weights in host RAM")
    assert "over 70% of its 64 GB" in short.why[0]
    assert plan_placement(ids(8), memory=Memory(H100, GB_7B, GB_7B, 0.5, host_gb=512)).mode == "colocated"
    assert plan_placement(ids(8), memory=Memory(H100, GB_135M, GB_135M, 0.5, host_gb=64)).mode == "colocated"
    one = plan_placement(ids(1), memory=Memory(H100, GB_7B, GB_7B, 0.5, host_gb=16))
    assert one.mode == "colocated"
    assert one.why[-1].startswith("warning: 1 slept engine(s) would keep about 14 GB") and "swap" in one.why[-1]
