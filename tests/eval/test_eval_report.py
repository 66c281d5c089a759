"""fast_p / correctness / speedup arithmetic on hand-made verdicts (KernelBench's definitions)."""

import json
import math
import subprocess
import sys

import pytest

from kforge.eval.build import parse_id_range
from kforge.eval.compare import rows as compare_rows
from kforge.eval.report import FAST_PS, SampleOutcome, fast_key, pass_at_k, summarize, summary_keys
from kforge.evaluator.verdict import Status, Verdict


def v(status="correct", speedup=None, flags=()):
    return Verdict(Status(status), trials_passed=5 if status == "correct" else 0, trials=5, speedup=speedup,
                   flags=list(flags))


def test_fast_p_over_all_problems_one_sample_each():
    outcomes = [
        SampleOutcome("1/1", 1, v(speedup=2.5)),           # correct, fast_1 and fast_2
        SampleOutcome("1/2", 1, v(speedup=1.5)),           # correct, fast_1 only
        SampleOutcome("1/3", 1, v(speedup=0.5)),           # correct, slower than eager
        SampleOutcome("1/4", 1, v("incorrect", speedup=9.0)),  # fast but wrong: counts for nothing
        SampleOutcome("2/1", 2, v(speedup=3.0, flags=["pytorch_op"])),  # flagged: never correct
        SampleOutcome("2/2", 2, None),                      # no kernel at all
    ]
    s = summarize(outcomes)
    o = s["overall"]
    assert o["n_problems"] == 6
    assert o["fast_0"] == pytest.approx(3 / 6) and o["correctness"] == o["fast_0"]
    assert o["fast_1"] == pytest.approx(2 / 6)
    assert o["fast_2"] == pytest.approx(1 / 6)
    assert o["flagged_rate"] == pytest.approx(1 / 6)
    assert o["compile_rate"] == pytest.approx(5 / 6)  # every verdict but the missing kernel compiled
    assert o["fast_1.2"] == pytest.approx(2 / 6) and o["fast_1.5"] == pytest.approx(1 / 6)
    assert o["fast_0.5"] == pytest.approx(2 / 6)  # 0.5 is not > 0.5
    assert o["fast_0.8"] == pytest.approx(2 / 6)
    assert o["mean_speedup"] == pytest.approx((2.5 + 1.5 + 0.5) / 3)
    assert o["geomean_speedup"] == pytest.approx((2.5 * 1.5 * 0.5) ** (1 / 3))
    assert s["level_1"]["fast_1"] == pytest.approx(2 / 4)
    assert s["level_2"]["fast_0"] == 0.0 and s["level_2"]["mean_speedup"] is None


def test_every_key_in_every_group_and_pass_at_k_up_to_the_samples():
    outcomes = [SampleOutcome(f"{lvl}/{i}", lvl, v(speedup=1.3 * i)) for lvl in (1, 2, 3) for i in (1, 2) for _ in range(3)]
    s = summarize(outcomes)
    assert set(s) == {"overall", "level_1", "level_2", "level_3"}
    for group in s.values():
        assert set(summary_keys(3)) <= set(group), set(summary_keys(3)) - set(group)
        assert "pass@4" not in group
    assert [fast_key(p) for p in FAST_PS] == ["fast_0", "fast_0.5", "fast_0.8", "fast_1", "fast_1.2", "fast_1.5",
                                               "fast_2"]
    assert s["level_2"]["n_problems"] == 2 and s["level_2"]["n_samples"] == 6
    # Speedups 1.3 (problem 1) and 2.6 (problem 2): both beat 1.2, only problem 2 beats 1.5 and 2.
    assert s["level_1"]["fast_1.2"] == pytest.approx(1.0)
    assert s["level_1"]["fast_1.5"] == pytest.approx(0.5) == s["level_1"]["fast_2"]
    assert s["level_1"]["pass@3"] == 1.0


def test_first_turn_against_best_of_turns():
    outcomes = [
        SampleOutcome("1/1", 1, v(speedup=1.5), first_verdict=v("incorrect")),  # fixed at a later turn
        SampleOutcome("1/2", 1, v(speedup=1.3), first_verdict=v(speedup=1.1)),  # made faster later
        SampleOutcome("1/3", 1, v(speedup=2.0), first_verdict=None),  # turn 1 had no kernel at all
        SampleOutcome("1/4", 1, v(speedup=1.25)),  # single-turn: turn 1 is the best
    ]
    o = summarize(outcomes)["overall"]
    assert o["first_turn_correctness"] == pytest.approx(2 / 4)
    assert o["best_of_turns_correctness"] == pytest.approx(1.0) == o["correctness"]
    assert o["first_turn_fast_1.2"] == pytest.approx(1 / 4)
    assert o["best_of_turns_fast_1.2"] == pytest.approx(1.0)


def test_speedup_exactly_p_is_not_faster():
    s = summarize([SampleOutcome("1/1", 1, v(speedup=1.0))])["overall"]
    assert s["fast_0"] == 1.0 and s["fast_1"] == 0.0


def test_several_samples_average_within_a_problem_first():
    outcomes = [SampleOutcome("1/1", 1, v(speedup=2.0)), SampleOutcome("1/1", 1, v("incorrect")),
                SampleOutcome("1/2", 1, v("incorrect")), SampleOutcome("1/2", 1, v("incorrect"))]
    s = summarize(outcomes)["overall"]
    assert s["fast_0"] == pytest.approx((0.5 + 0.0) / 2)
    assert s["pass@1"] == pytest.approx(0.25)
    assert s["pass@2"] == pytest.approx(0.5)  # problem 1 solved by one of its two samples


def test_untimed_cpu_verdicts_give_correctness_but_no_fast_1():
    s = summarize([SampleOutcome("1/1", 1, v(speedup=None))])["overall"]
    assert s["fast_0"] == 1.0 and s["fast_1"] == 0.0 and s["timed"] is False


def test_pass_at_k_estimator():
    assert pass_at_k(10, 0, 3) == 0.0
    assert pass_at_k(10, 10, 3) == 1.0
    assert pass_at_k(4, 1, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(4, 2))
    # pass@k stops at the fewest samples any problem of the group has: a larger k cannot be estimated.
    uneven = [SampleOutcome("1/1", 1, v()), SampleOutcome("1/1", 1, v("incorrect")), SampleOutcome("1/2", 1, v())]
    s = summarize(uneven)["overall"]
    assert "pass@1" in s and "pass@2" not in s and "pass@5" not in s


def test_id_ranges():
    assert parse_id_range("1-20") == (1, 20)
    assert parse_id_range("7") == (7, 7)
    assert parse_id_range("5-") == (5, None)
    with pytest.raises(ValueError):
        parse_id_range("a-b")


def test_compare_files(tmp_path):
    a = {"summary": {"overall": {"fast_1": 0.25, "n_problems": 4, "timed": True}}}
    b = {"summary": {"overall": {"fast_1": 0.5, "n_problems": 4, "timed": True}}}
    rows = {(g, k): d for g, k, _, _, d in compare_rows(a["summary"], b["summary"])}
    assert rows[("overall", "fast_1")] == pytest.approx(0.25)
    assert rows[("overall", "n_problems")] == 0
    fa, fb = tmp_path / "a.json", tmp_path / "b.json"
    fa.write_text(json.dumps(a))
    fb.write_text(json.dumps(b))
    out = subprocess.run([sys.executable, "-m", "kforge", "eval", "compare", str(fa), str(fb)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fast_1" in out.stdout and "+0.250" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "kforge", "eval", "compare", str(fa)],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2
