"""`kforge problems generate`: the same knobs give the same bytes, held-out structures never occur in training
and use only primitives training has, the split travels on the rows to every command, bad knobs are one line
(exit 2), a folder it did not write is left alone, and its solutions pass kforge's own judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kforge.problems import generate as gen
from kforge.problems import load_problems, split_problems, training_keys
from kforge.problems.generate import expr
from kforge.problems.generate.expr import Node
from kforge.problems.sources import ProblemSourceError

SMALL = gen.Knobs(train=40, heldout=12, seed=5)


def kforge(*args):
    return subprocess.run([sys.executable, "-m", "kforge", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL)


def test_the_same_seed_and_knobs_give_the_same_bytes_and_another_seed_other_problems(tmp_path: Path):
    assert gen.build(SMALL).texts() == gen.build(SMALL).texts()
    other = gen.build(gen.Knobs(train=40, heldout=12, seed=6)).texts()
    assert other["problems.jsonl"] != gen.build(SMALL).texts()["problems.jsonl"]
    args = ["problems", "generate", "--train", "6", "--heldout", "2", "--seed", "11"]
    for name in ("a", "b"):
        res = kforge(*args, "--out", str(tmp_path / name))
        assert res.returncode == 0, res.stderr
    files = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert files == ["curriculum.json", "problems.jsonl", "sft_pairs.jsonl"]
    for name in files:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_the_structure_key_blanks_constants_sorts_commutative_arguments_and_renames_inputs():
    sin_y, sin_x = Node("sin", (Node("y"),)), Node("sin", (Node("x"),))
    a = Node("add", (Node("x"), sin_y))
    assert expr.structure_key(a, 2, None) == expr.structure_key(Node("add", (sin_y, Node("x"))), 2, None)
    assert expr.structure_key(a, 2, None) == expr.structure_key(Node("add", (Node("y"), sin_x)), 2, None)
    c1, c2 = Node("scale", (a,), (0.5,)), Node("scale", (a,), (-2.0,))
    assert expr.structure_key(c1, 2, "sum") == expr.structure_key(c2, 2, "sum")
    assert expr.structure_key(c1, 2, "sum") != expr.structure_key(c1, 2, "amax") != expr.structure_key(c1, 2, None)
    sub = Node("sub", (Node("x"), sin_y))  # not commutative: x - sin(y) is not sin(y) - x
    assert expr.structure_key(sub, 2, None) != expr.structure_key(Node("sub", (sin_y, Node("x"))), 2, None)


@pytest.mark.parametrize("knobs", [SMALL, gen.Knobs(train=3, heldout=4, seed=2, depth=4),
                                   gen.Knobs(train=30, heldout=30, depth=2, inputs=2, reduce_share=0.5, seed=1)])
def test_held_out_structures_are_new_and_use_only_primitives_training_has(knobs):
    manifest = gen.build(knobs).manifest
    by_split = {s: [p for p in manifest["problems"] if p["split"] == s] for s in ("train", "test")}
    assert (len(by_split["train"]), len(by_split["test"])) == (knobs.train, knobs.heldout)
    structures = [p["structure"] for p in manifest["problems"]]
    assert len(set(structures)) == len(structures)  # distinct, so no held-out one is a training one
    seen = set().union(*(p["primitives"] for p in by_split["train"]))
    for p in by_split["test"]:
        assert set(p["primitives"]) <= seen, (p["key"], set(p["primitives"]) - seen)
    assert set(manifest["primitives"]["test"]) <= set(manifest["primitives"]["train"])
    assert manifest["knobs"]["seed"] == knobs.seed


def test_every_reference_is_finite_and_uses_every_input_it_takes():
    rows = gen.build(gen.Knobs(train=60, heldout=20, seed=9, rows=4, cols=64, depth=4, reduce_share=0.3)).rows
    torch.manual_seed(0)
    for row in rows:
        scope: dict = {}
        exec(row["code"], scope)
        inputs = [t * 30 for t in scope["get_inputs"]()]  # far out in the tails too
        out = scope["Model"](*scope["get_init_inputs"]())(*inputs)
        assert torch.isfinite(out).all(), row["name"]
        params = row["code"].split("def forward(self, ")[1].split(")")[0].count(": torch.Tensor")
        assert params == len(inputs) and all(n in row["code"].split("return ")[1] for n in "xyz"[:params])
    for text in (r["code"] for r in rows):
        assert "/" not in text.split("return ")[1] and "log" not in text and "sqrt" not in text


def test_the_split_is_on_the_rows_and_every_command_reads_it(tmp_path: Path):
    from kforge.config.schema import DatasetConfig

    gen.write(tmp_path, gen.build(SMALL).texts())
    source = tmp_path / "problems.jsonl"
    problems = load_problems(str(source))
    manifest = gen.read_manifest(tmp_path)
    declared = {p["key"]: p["split"] for p in manifest["problems"]}
    assert {p.key: p.split for p in problems} == declared
    for fraction, seed in ((0.1, 0), (0.5, 7)):  # the source's split, whatever the fraction and seed
        train, test = split_problems(problems, fraction, seed)
        assert {p.key for p in test} == {k for k, s in declared.items() if s == "test"}
        assert training_keys(DatasetConfig(source=str(source), test_fraction=fraction, seed=seed)) == {
            k for k, s in declared.items() if s == "train"}
    pairs = [json.loads(line)["problem"] for line in (tmp_path / "sft_pairs.jsonl").read_text().splitlines()]
    assert sorted(pairs) == sorted(k for k, s in declared.items() if s == "train")
    rows = [json.loads(line) for line in source.read_text().splitlines()]
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "split" or i}) + "\n"
                             for i, r in enumerate(rows)))
    with pytest.raises(ProblemSourceError, match="has no split while"):
        split_problems(load_problems(str(mixed)), 0.1, 0)
    (tmp_path / "bad.jsonl").write_text(json.dumps({**rows[0], "split": "validation"}) + "\n")
    with pytest.raises(ProblemSourceError, match="split 'validation'"):
        load_problems(str(tmp_path / "bad.jsonl"))


@pytest.mark.parametrize("knobs, says", [
    (["--train", "0"], "--train 0: give an integer >= 1"),
    (["--reduce-share", "1.5"], "--reduce-share 1.5"),
    (["--inputs", "4"], "--inputs 4: at most 3"),
    (["--family", "matmul"], "--family 'matmul'"),
    (["--train", "8", "--heldout", "4", "--depth", "1", "--inputs", "1", "--reduce-share", "0"],
     "distinct structures"),  # 9 one-primitive expressions of x exist: too few for 12
])
def test_bad_knobs_are_one_line_and_exit_2_and_write_nothing(tmp_path: Path, knobs, says):
    res = kforge("problems", "generate", "--out", str(tmp_path / "c"), *knobs)
    assert res.returncode == 2, res.stdout + res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "c").exists()


def test_a_folder_it_did_not_write_is_left_alone_and_its_own_is_written_again(tmp_path: Path):
    texts = gen.build(gen.Knobs(train=4, heldout=2)).texts()
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    with pytest.raises(gen.GenerateError, match="did not write"):
        gen.write(theirs, texts)
    (theirs / "curriculum.json").write_text("{}")  # a manifest that is not this command's
    (theirs / "notes.txt").unlink()
    with pytest.raises(gen.GenerateError, match="did not write"):
        gen.write(theirs, texts)
    assert (theirs / "curriculum.json").read_text() == "{}"
    ours = tmp_path / "ours"
    gen.write(ours, texts)
    gen.write(ours, gen.build(gen.Knobs(train=5, heldout=2)).texts())
    assert len((ours / "sft_pairs.jsonl").read_text().splitlines()) == 5


@pytest.mark.slow  # a pool judges generated problems
def test_a_sample_of_solutions_is_judged_correct_by_the_real_pool_and_a_wrong_one_is_not(tmp_path: Path):
    """Through EvalPool on the CPU (Triton interpreter), as `kforge problems generate --verify` judges them:
    a flat kernel, a row sum and a row max; a solution whose output is off by 0.1 % must fail."""
    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator import EvalPool
    from kforge.ops.curriculum import judge_solutions, problems_of

    curriculum = gen.build(gen.Knobs(train=40, heldout=10, seed=3, reduce_share=0.5))
    problems = problems_of(curriculum.rows, "generate")
    kinds = {p["key"]: p["reduce"] for p in curriculum.manifest["problems"]}
    sample = [next(p for p in problems if kinds[p.key] == kind) for kind in (None, "sum", "amax")]
    store = "tl.store(out_ptr + offsets, "
    wrong = next(p for p in problems if kinds[p.key] is None and p not in sample)
    broken = type(wrong)(**{**wrong.to_dict(), "solution": wrong.solution.replace(store, store + "1.001 * ")})
    cfg = EvaluatorConfig(num_correct_trials=2, measure_performance=False, run_timeout_s=60.0, cpu_workers=2,
                          memory_limit_gb=4.0)
    heard: list[str] = []
    with EvalPool(cfg, devices=None, cache_dir=tmp_path / "cache") as pool:
        refused = judge_solutions(pool, [*sample, broken], lambda p, v: heard.append(p.key))
    assert [p.key for p, _ in refused] == [broken.key], [(p.key, v.status, v.feedback) for p, v in refused]
    assert refused[0][1].status.value == "incorrect" and len(heard) == 4



def test_the_learn_preset_trains_on_the_rows_train_split_and_eval_scores_the_held_out_one(tmp_path: Path):
    from kforge.config.loader import resolve
    from kforge.eval.build import apply_split
    from kforge.problems import problems_from_config
    from kforge.train.build import split

    gen.write(tmp_path, gen.build(SMALL).texts())
    cfg = resolve("learn", None, [f"dataset.source={tmp_path / 'problems.jsonl'}"]).config
    assert cfg.episode.mode == "single_turn" and cfg.episode.max_turns == 1
    r = cfg.reward
    assert r.speed_weight == 0 and not cfg.evaluator.measure_performance and r.format_weight > 0 < r.compile_weight
    assert r.length_weight == 0 and r.thinking_weight == 0
    # an incorrect kernel's best (format, compile, full partial credit) stays far below a correct one's worst
    assert r.format_weight + r.compile_weight + r.partial_credit * r.correctness_weight < 0.5 * r.correctness_weight
    declared = {p["key"]: p["split"] for p in gen.read_manifest(tmp_path)["problems"]}
    train, test = split(cfg)
    assert {p.key for p in train} == {k for k, s in declared.items() if s == "train"}
    assert {p.key for p in test} == {k for k, s in declared.items() if s == "test"}
    kept, trained = apply_split(problems_from_config(cfg.dataset), "test", cfg.dataset, is_run=True)
    assert {p.key for p in kept} == {p.key for p in test} and trained == {p.key for p in train}
    # `kforge eval ADAPTER --preset learn dataset.source=...`: the split comes from the preset before the
    # command's overrides (whose source is not this one); the rows' declared split still decides
    preset_only = resolve("learn", None, []).config.dataset
    kept, trained = apply_split(problems_from_config(cfg.dataset), "test", preset_only, is_run=False)
    assert {p.key for p in kept} == {p.key for p in test} and trained == {p.key for p in train}
