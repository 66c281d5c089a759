"""bench/steps_per_hour.py on run folders whose answer is known: step seconds from consecutive records after
the warm-up, steps per hour, staleness where a run logged it, the plan from the run's log, the ratio to the
base row, and a folder that is no run refused in one line."""

from __future__ import annotations

import json

import pytest

from bench import steps_per_hour as sph


def _run(folder, times, staleness=None, plan=None):
    folder.mkdir()
    rows = []
    for step, t in enumerate(times, start=1):
        row = {"step": step, "time": t}
        if staleness is not None:
            row.update({"staleness/mean": staleness[step - 1], "staleness/max": 2.0 * staleness[step - 1]})
        rows.append(json.dumps(row))
    (folder / "metrics.jsonl").write_text("\n".join(rows) + "\n")
    if plan:
        (folder / "logs.log").write_text(f"12:00:00 INFO {plan}\nother line\n")
    return folder


def test_steps_per_hour_staleness_plan_and_ratio(tmp_path):
    one = _run(tmp_path / "g1", [1000.0, 1100.0, 1200.0, 1300.0], plan="placement [colocated]: rollout=GPU 0")
    # Continuous on two GPUs: 50 s steps, staleness logged (step 1's record ends the warm-up: not counted).
    two = _run(tmp_path / "g2", [1000.0, 1050.0, 1100.0, 1150.0], staleness=[0.0, 0.5, 1.0, 1.5])
    rows = [sph.read_run(one, "1 GPU default", 1), sph.read_run(two, "2 GPUs continuous", 1)]
    assert rows[0].steps == [100.0, 100.0, 100.0] and rows[0].per_hour == pytest.approx(36.0)
    assert rows[1].steps == [50.0, 50.0, 50.0] and rows[1].per_hour == pytest.approx(72.0)
    assert rows[1].staleness_mean == pytest.approx(1.0) and rows[1].staleness_max == pytest.approx(3.0)
    assert sph.read_run(one, "x", 2).steps == [100.0, 100.0]  # --skip 2: step 2 left out too
    text = sph.table(rows)
    assert "| 1 GPU default | [colocated]: rollout=GPU 0 | 3 | 100.0 (100.0-100.0) | 36.0 | - | 1.00x |" in text
    assert "| 2 GPUs continuous | - | 3 | 50.0 (50.0-50.0) | 72.0 | 1.00 / 3 | 2.00x |" in text
    assert "| 1 GPU default | [colocated]: rollout=GPU 0 | 3 | 100.0 (100.0-100.0) | 36.0 | - | 0.50x |" in \
        sph.table(rows, base="2 GPUs continuous")


def test_a_folder_without_metrics_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        sph.main([str(tmp_path)])
    assert exc.value.code == 2 and "has no metrics.jsonl" in capsys.readouterr().err
    _run(tmp_path / "r", [0.0, 10.0, 20.0])
    with pytest.raises(SystemExit) as exc:
        sph.main([f"{tmp_path / 'r'}=a", "--base", "b"])
    assert exc.value.code == 2 and "--base b is none of the labels (a)" in capsys.readouterr().err
    sph.main([f"{tmp_path / 'r'}=a"])
    assert "| a | - | 2 | 10.0 (10.0-10.0) | 360.0 | - | 1.00x |" in capsys.readouterr().out
