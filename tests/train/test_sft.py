"""`kforge sft`: the supervised warm start. The refusals run without a model; the learner's supervised step
is checked on a scratch model against a cross-entropy computed here; the slow test runs the command on the
built-in solutions with the tiny preset and evaluates the adapter it wrote with `kforge eval`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kforge.config.loader import resolve
from kforge.credit.samples import Sample
from kforge.problems import builtin_problems
from kforge.rollout.base import BackendDefaults
from kforge.train import sft as warm
from tiny_models import make_learner, one_thread, tiny_cfg, tiny_model  # noqa: F401  (one_thread: an autouse fixture)


def _kforge(*args):
    from typer.testing import CliRunner

    from kforge.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _held_out_tiny():
    return warm.held_out_problems(resolve("tiny", None, []).config)


def test_a_set_with_a_held_out_solution_is_refused_in_one_line(tmp_path: Path):
    held = _held_out_tiny()[0]
    solution = next(p.solution for p in builtin_problems() if p.key == held.key and p.source == held.source)
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"problem": "1/1", "code": "x = 1"}) + "\n"
                    + json.dumps({"problem": held.key, "code": solution}) + "\n")
    res = _kforge("sft", "--preset", "tiny", "--data", data, "--out", tmp_path / "ad")
    assert res.exit_code == 2
    line = res.output.strip()
    assert "\n" not in line and f"{data}:2" in line and held.key in line and "holds out" in line
    assert not (tmp_path / "ad").exists()


def test_the_same_problem_under_another_name_is_refused_too(tmp_path: Path):
    held = _held_out_tiny()[0]
    data = tmp_path / "pairs.jsonl"  # its architecture given as text, not by key
    data.write_text(json.dumps({"prompt": held.code, "code": "x = 1"}) + "\n")
    res = _kforge("sft", "--preset", "tiny", "--data", data, "--out", tmp_path / "ad")
    assert res.exit_code == 2 and held.key in res.output


@pytest.mark.parametrize("line, says", [
    ('{"problem": "1/1"}', 'no "code"'),
    ('{"code": "x = 1"}', 'give "problem"'),
    ('{"problem": "1/77", "code": "x = 1"}', "no problem 1/77"),
    ("[1, 2]", "expected a JSON object"),
])
def test_bad_pairs_name_the_line(tmp_path: Path, line: str, says: str):
    data = tmp_path / "pairs.jsonl"
    data.write_text(line + "\n")
    res = _kforge("sft", "--preset", "tiny", "--data", data, "--out", tmp_path / "ad")
    assert res.exit_code == 2 and f"{data}:1" in res.output and says in res.output, res.output


def test_an_existing_out_folder_is_never_written(tmp_path: Path):
    (tmp_path / "ad").mkdir()
    (tmp_path / "ad" / "mine.txt").write_text("keep")
    res = _kforge("sft", "--preset", "tiny", "--out", tmp_path / "ad")
    assert res.exit_code == 2 and "exists" in res.output
    assert [p.name for p in (tmp_path / "ad").iterdir()] == ["mine.txt"]


def test_the_default_set_is_the_built_in_solutions_less_the_held_out_problems():
    held = _held_out_tiny()
    pairs, left_out = warm.default_pairs(held)
    keys = {(p.problem.source, p.problem.key) for p in pairs}
    assert {(p.source, p.key) for p in held} <= {(p.source, p.key) for p in left_out}
    assert not keys & {(p.source, p.key) for p in held}
    assert len(pairs) + len(left_out) == sum(1 for p in builtin_problems() if p.solution)
    assert all(p.code == p.problem.solution for p in pairs)


def test_the_supervised_step_is_cross_entropy_on_the_answer_tokens():
    cfg = warm.sft_config(tiny_cfg(warmup_steps=0, grad_clip=10.0), learning_rate=3e-2)
    learner = make_learner(cfg, model=tiny_model())
    samples = [Sample([3, 4, 5], [6, 7, 8], 1.0), Sample([9, 4], [10, 11, 12, 13], 1.0)]

    def cross_entropy() -> float:  # the plain definition: mean over answer tokens of -log softmax
        total, n = 0.0, 0
        learner.model.eval()
        with torch.no_grad():
            for s in samples:
                ids = torch.tensor([s.prompt_ids + s.response_ids])
                logits = learner.model(input_ids=ids).logits[0, len(s.prompt_ids) - 1:-1]
                total += float(torch.nn.functional.cross_entropy(logits, torch.tensor(s.response_ids), reduction="sum"))
                n += len(s.response_ids)
        return total / n

    before = cross_entropy()
    assert warm.mean_nll(learner, samples) == pytest.approx(before, rel=1e-5)
    # The held-out loss reads the learner's own path: packed rows (one row for both samples) give the same.
    packed = make_learner(cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"pack": True})}),
                     model=tiny_model())
    packed.model.load_state_dict(learner.model.state_dict())
    assert warm.mean_nll(packed, samples) == pytest.approx(before, rel=1e-4)
    metrics = learner.train_step(samples)
    assert metrics["loss"] == pytest.approx(before, rel=1e-5)  # the step's loss is that cross-entropy
    for _ in range(5):
        learner.train_step(samples)
    assert cross_entropy() < before - 0.1


def test_answers_are_what_the_parser_reads():
    from kforge.policy.parsing import parse_response

    code = next(p.solution for p in builtin_problems() if p.solution)
    for thinking in (False, True):
        cand = parse_response(warm.answer_text(code, thinking), "1/1", "triton", thinking)
        assert cand.code == code.strip() and cand.parse_error is None


@pytest.mark.slow
def test_sft_on_the_built_in_solutions_writes_an_adapter_that_eval_and_train_load(tmp_path: Path):
    out = tmp_path / "warm"
    res = _kforge("sft", "--preset", "tiny", "--problems", "1/1,1/2", "--epochs", "1", "--batch-size", "2",
                  "--lr", "1e-3", "--out", out, "dataset.prompt_option=compact")
    assert res.exit_code == 0, res.output
    assert "epoch 1/1: train loss" in res.output
    record = json.loads((out / warm.SFT_FILE).read_text())
    assert record["train_problems"] == ["1/1", "1/2"] and record["epochs"][0]["train_loss"] > 0
    config = json.loads((out / "adapter_config.json").read_text())
    assert config["r"] == 8 and sorted(config["target_modules"]) == ["q_proj", "v_proj"]

    results = tmp_path / "eval.json"
    res = _kforge("eval", out, "--preset", "tiny", "--source", "builtin", "--level", "1", "--problems", "4-4",
                  "--turns", "1", "--out", results, "rollout.max_tokens=8", "dataset.prompt_option=compact")
    assert res.exit_code == 0, res.output
    doc = json.loads(results.read_text())
    assert doc["adapter"] == str(out) and doc["summary"]["overall"]["n_problems"] == 1

    # `kforge train ... model.checkpoint=DIR` starts its learner from these weights.
    from safetensors.torch import load_file

    cfg = resolve("tiny", None, [f"model.checkpoint={out}"]).config
    learner = make_learner(cfg)
    saved = load_file(str(out / "adapter_model.safetensors"))
    state = {k: v for k, v in learner.model.state_dict().items() if "lora_" in k and ".default." in k}
    assert len(saved) == len(state) > 0
    for key, value in saved.items():
        match = [v for k, v in state.items() if k.replace(".default", "") == key]
        assert len(match) == 1 and torch.equal(match[0], value), key


class _Replying(BackendDefaults):
    """Stands in for the rollout engine at its edge: records the prompt ids it is sent and answers with the
    warm start's answer text for that problem, tokenised with the real tokenizer."""

    def __init__(self, tokenizer, replies: dict[str, str]):
        self.tokenizer, self.replies, self.prompts = tokenizer, replies, []

    async def agenerate(self, requests, on_completion=None):
        from kforge.rollout.base import Completion

        outs = []
        for i, r in enumerate(requests):
            self.prompts.append(list(r.prompt_ids))
            task = self.tokenizer.decode(r.prompt_ids).split("## Your task")[-1]  # not a worked example's code
            text = next(v for k, v in self.replies.items() if k in task)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            outs.append(Completion(ids, text, [-0.5] * len(ids), "stop"))
            if on_completion is not None:
                on_completion(i, outs[-1])
        return outs


@pytest.mark.parametrize("overrides", [[], ["dataset.prompt_option=one_shot", "episode.thinking=true",
                                            "reward.thinking_weight=0"], ["dataset.prompt_option=compact"]])
def test_pairs_are_prompted_as_train_prompts_and_answered_as_the_parser_reads(overrides):
    """The warm start trains on the very prompt ids a training episode's first turn sends, and an answer
    the parser of that episode reads back as the solution."""
    import asyncio

    from kforge.evaluator.verdict import Status, Verdict
    from kforge.modelio import load_tokenizer, resolve_model
    from kforge.policy.episode import run_episodes
    from kforge.policy.prompts import PromptBuilder

    cfg = resolve("tiny", None, overrides + ["episode.mode=single_turn"]).config
    tokenizer = load_tokenizer(resolve_model(cfg.model.name))
    pairs, _ = warm.default_pairs(warm.held_out_problems(cfg))
    pairs = pairs[:2]
    samples, skipped = warm.to_samples(pairs, PromptBuilder.from_config(cfg, tokenizer), cfg, tokenizer.eos_token_id)
    assert skipped == 0 and len(samples) == 2

    seen: dict[str, str] = {}

    async def evaluate(problem, code, backend):
        seen[problem.key] = code
        return Verdict(Status.CORRECT, trials_passed=2, trials=2)

    backend = _Replying(tokenizer, {p.problem.code.strip(): warm.answer_text(p.code, cfg.episode.thinking) for p in pairs})
    asyncio.run(run_episodes([(p.problem, 0) for p in pairs], backend, PromptBuilder.from_config(cfg, tokenizer),
                             evaluate, cfg, 0))
    assert backend.prompts == [s.prompt_ids for s in samples]
    assert seen == {p.problem.key: p.code.strip() for p in pairs}
    for s, p in zip(samples, pairs):
        assert s.response_ids[-1] == tokenizer.eos_token_id and s.advantage == 1.0
        assert tokenizer.decode(s.response_ids[:-1]) == warm.answer_text(p.code, cfg.episode.thinking)


def test_holdout_keeps_a_problem_s_pairs_together_and_needs_two_problems():
    pairs, _ = warm.default_pairs([])
    twice = pairs + [warm.Pair(p.problem, p.code + "\n# again", "x") for p in pairs]
    train, held = warm.split_pairs(twice, 0.25, seed=0)
    assert held and train and len(train) + len(held) == len(twice)
    assert not {p.problem.key for p in train} & {p.problem.key for p in held}
    assert len({p.problem.key for p in held}) == round(len(pairs) * 0.25)
    assert {p.problem.key for p in held} == {p.problem.key for p in warm.split_pairs(list(reversed(twice)), 0.25, 0)[1]}
    with pytest.raises(warm.SftError, match="one problem"):
        warm.split_pairs(pairs[:1], 0.5, seed=0)
