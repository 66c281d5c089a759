"""bench/learning_gpu.py's own parts: the problem family it writes, the gate, the split, the commands'
overrides (valid configs whose reward a template cannot game) and the two tests it declares."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from bench import learning_gpu as lg
from kforge.config.loader import resolve

KB = Path(__file__).resolve().parents[1].parent / "shared/data/kernelbench/problems.jsonl"


def test_cmh_of_one_stratum_is_the_hypergeometric_z():
    from scipy.stats import hypergeom

    a, n_a, c, n_b = 8, 10, 2, 10
    law = hypergeom(n_a + n_b, a + c, n_a)  # A's correct count with the margins fixed
    z = (a - law.mean() - 0.5) / math.sqrt(law.var())
    got = lg.cmh_greater([(a, n_a, c, n_b)])
    assert got["z"] == pytest.approx(z) and got["p"] == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)))
    assert got["odds_ratio"] == pytest.approx((8 * 8) / (2 * 2))
    assert 0.01 < got["p"] < 0.02


def test_cmh_adds_strata_and_ignores_constant_ones():
    one = lg.cmh_greater([(6, 10, 3, 10)])
    two = lg.cmh_greater([(6, 10, 3, 10), (6, 10, 3, 10)])
    assert two["p"] < one["p"] < 0.5  # the same effect twice is stronger evidence
    assert lg.cmh_greater([(6, 10, 3, 10), (10, 10, 10, 10), (0, 5, 0, 5)])["z"] == pytest.approx(one["z"])
    assert lg.cmh_greater([(3, 10, 6, 10)])["p"] > 0.5  # the other direction
    assert lg.cmh_greater([(0, 4, 0, 4)])["p"] == 1.0


def test_gate_keeps_the_band_and_the_split_holds_some_out(tmp_path: Path):
    rates = {"1/20": (0, 16), "1/22": (1, 16), "1/25": (8, 16), "1/26": (15, 16), "1/27": (16, 16), "1/28": (5, 16)}
    kept = lg.gate(rates, 0.03, 0.90)
    assert kept == ["1/22", "1/25", "1/28"]  # 0/16 never, 16/16 and 15/16 (0.94) too often
    train, held = lg.split_survivors(kept, 0.4, seed=0)
    assert sorted(train + held) == kept and not set(train) & set(held) and len(held) == 1
    assert (train, held) == lg.split_survivors(list(reversed(kept)), 0.4, seed=0)


def test_results_and_curves_are_read_from_kforge_files(tmp_path: Path):
    verdict = lambda status, flags=(): {"status": status, "flags": list(flags)}  # noqa: E731
    doc = {"samples": [{"problem_key": "1/20", "verdict": verdict("correct")},
                       {"problem_key": "1/20", "verdict": verdict("correct", ["pytorch_op"])},
                       {"problem_key": "1/20", "verdict": None},
                       {"problem_key": "1/22", "verdict": verdict("incorrect")}]}
    (tmp_path / "r.json").write_text(json.dumps(doc))
    assert lg.per_problem(tmp_path / "r.json") == {"1/20": (1, 3), "1/22": (0, 1)}
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "rate/correct": s / 10}) + "\n" for s in (1, 2)))
    assert lg.curve(tmp_path) == {1: 0.1, 2: 0.2}


@pytest.mark.skipif(not KB.is_file(), reason="needs KernelBench's problems.jsonl")
def test_the_family_is_shrunk_kernelbench_activations_the_warm_start_never_saw(tmp_path: Path):
    args = lg.parse_args(["--out", str(tmp_path), "--kernelbench", str(KB), "--rows", "4", "--dim", "64"])
    source, pairs, sft_keys, family = lg.write_problems(args)
    rows = {f"1/{r['problem_id']}": r for r in map(json.loads, source.read_text().splitlines())}
    assert sft_keys == ["1/1", "1/2", "1/3", "1/6"] and len(family) == 11
    assert not set(sft_keys) & set(family)
    names = {rows[k]["name"].split("_", 1)[1].lower().strip("_") for k in family}
    assert not names & {"relu", "sigmoid", "add", "scale_bias"}  # no op of the warm start
    for key in family:
        assert "batch_size = 4\n" in rows[key]["code"] and "dim = 64\n" in rows[key]["code"]
    from kforge.problems import load_problems

    loaded = {p.key: p for p in load_problems(str(source), [1])}
    assert set(loaded) == set(rows)
    x = {}
    exec(loaded["1/22"].code, x)  # the shrunk problem really builds inputs of that size
    assert tuple(x["get_inputs"]()[0].shape) == (4, 64)
    assert [json.loads(line)["problem"] for line in pairs.read_text().splitlines()] == sft_keys


@pytest.mark.parametrize("arm", list(lg.ARMS))
def test_every_command_resolves_and_its_reward_ranks_correct_first(arm: str, tmp_path: Path):
    args = lg.parse_args(["--out", str(tmp_path)])
    cfg = resolve("tiny", None, lg.common(args, tmp_path / "family.jsonl") + [f"learner.learning_rate={args.lr}"]
                  + lg.ARMS[arm]).config
    assert cfg.reward.speed_weight == 0 and cfg.rollout.backend == "vllm"
    assert cfg.learner.shuffle_advantages is (arm == "shuffled")
    assert (cfg.learner.learning_rate == 0) is (arm == "control")
    r = cfg.reward
    # an incorrect kernel's best (format, compile, full partial credit) stays far below a correct one's worst
    assert r.format_weight + r.compile_weight + r.partial_credit * r.correctness_weight < 0.5 * r.correctness_weight


def test_a_run_whose_start_failed_is_started_again_and_a_later_failure_stops_the_bench(tmp_path: Path, monkeypatch):
    """side_by_side with each `kforge train` replaced by a small script: `shuffled` fails at its first start
    (as an engine start disturbed by another process), `control` fails after its first step."""
    import subprocess
    import sys

    runs = tmp_path / "runs"
    calls: list[str] = []

    def fake_start(argv, log):
        arm = argv[0]
        calls.append(arm)
        d = runs / arm
        script = (f"import json, pathlib, time; d = pathlib.Path({str(d)!r}); d.mkdir(parents=True, exist_ok=True); "
                  "(d / 'status.json').write_text(json.dumps({'status': 'running'})); time.sleep(0.2); ")
        if arm == "shuffled" and calls.count(arm) == 1:
            script = "import sys; sys.exit(1)"
        elif arm == "control":
            script += "(d / 'metrics.jsonl').write_text('{}\\n'); raise SystemExit(1)"
        else:
            script += "(d / 'metrics.jsonl').write_text('{}\\n')"
        log.parent.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen([sys.executable, "-c", script])

    monkeypatch.setattr(lg, "start", fake_start)
    monkeypatch.setattr(lg.time, "sleep", lambda s: None if s > 1 else __import__("time").sleep(0.05))
    logs = {arm: tmp_path / "logs" / f"{arm}.out" for arm in lg.ARMS}
    with pytest.raises(SystemExit, match="train control failed"):
        lg.side_by_side({arm: [arm] for arm in lg.ARMS}, logs, runs, stagger_s=5.0)
    assert calls == ["real", "shuffled", "shuffled", "control"]  # control failed after a step: not redone


@pytest.mark.skipif(not KB.is_file(), reason="needs KernelBench's problems.jsonl")
def test_kernelbench_solutions_join_the_warm_start_and_leave_the_family(tmp_path: Path):
    pairs_file = Path(lg.__file__).parent / "data" / "activation_solutions.jsonl"
    args = lg.parse_args(["--out", str(tmp_path), "--kernelbench", str(KB), "--sft-pairs", str(pairs_file),
                          "--temperature", "0.7"])
    source, pairs, sft_keys, family = lg.write_problems(args)
    added = [json.loads(line)["problem"] for line in pairs_file.read_text().splitlines()]
    assert sft_keys == ["1/1", "1/2", "1/3", "1/6", *added] and not set(added) & set(family)
    assert set(family) == {f"1/{i}" for i in lg.FAMILY_KERNELBENCH} - set(added) and "1/88" in family
    keys = {f"1/{r['problem_id']}" for r in map(json.loads, source.read_text().splitlines())}
    assert set(added) <= keys  # the warm start's prompts are built from these problems
    assert "rollout.temperature=0.7" in lg.common(args, source)


def test_family_can_be_narrowed_and_a_key_outside_it_is_refused(tmp_path: Path):
    args = lg.parse_args(["--out", str(tmp_path), "--kernelbench", str(KB), "--family", "1/22,1/25"])
    assert lg.write_problems(args)[3] == ["1/22", "1/25"]
    args = lg.parse_args(["--out", str(tmp_path), "--kernelbench", str(KB), "--family", "1/19"])
    with pytest.raises(SystemExit, match="1/19 not in the family"):
        lg.write_problems(args)
