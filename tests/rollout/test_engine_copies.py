"""The adapter copies handed to the rollout engine (kforge.rollout.adapters.EngineCopies): written in the
engine's dtype where it is fastest (a /dev/shm stand-in here), never seen half-written, moved to the run
folder when /dev/shm is missing or full, and removed from /dev/shm at the end of a run."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from kforge.config.schema import KforgeConfig
from kforge.learner.checkpoint import atomic_folder
from kforge.learner.learner import Learner
from kforge.rollout import adapters
from kforge.rollout.adapters import EngineCopies
from tiny_models import make_learner


def tiny_learner() -> Learner:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    cfg = KforgeConfig()
    cfg.lora.rank = 4
    cfg.lora.alpha = 8
    learner = make_learner(cfg, model=model)
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in learner.params:
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return learner


def fake_save(folder: Path, dtype: str | None) -> None:
    with atomic_folder(folder) as tmp:
        (tmp / "adapter_config.json").write_text(json.dumps({"dtype": dtype}))
        (tmp / "adapter_model.safetensors").write_bytes(b"x" * 1000)


def test_the_engine_copy_is_the_adapter_in_bf16(tmp_path):
    from peft import PeftModel
    from safetensors.torch import load_file

    learner = tiny_learner()
    learner.save_adapter(tmp_path / "fp32")
    learner.save_adapter(tmp_path / "bf16", "bfloat16")
    full = load_file(tmp_path / "fp32" / "adapter_model.safetensors")
    half = load_file(tmp_path / "bf16" / "adapter_model.safetensors")
    assert set(full) == set(half) and full
    assert {t.dtype for t in full.values()} == {torch.float32} and {t.dtype for t in half.values()} == {torch.bfloat16}
    for key in full:
        assert torch.equal(half[key], full[key].to(torch.bfloat16))
    nbytes = [sum(t.numel() * t.element_size() for t in d.values()) for d in (full, half)]
    assert nbytes[1] * 2 == nbytes[0]  # half the bytes to write and to read back
    config = json.loads((tmp_path / "bf16" / "adapter_config.json").read_text())
    assert config == json.loads((tmp_path / "fp32" / "adapter_config.json").read_text())
    assert all(p.dtype == torch.float32 for p in learner.params)  # the master weights stay fp32
    # PEFT loads it as any adapter.
    from transformers import LlamaConfig, LlamaForCausalLM

    base = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32))
    PeftModel.from_pretrained(base, str(tmp_path / "bf16"))


def test_copies_go_to_shm_in_the_engine_dtype_and_are_removed_at_close(tmp_path):
    shm, run = tmp_path / "shm", tmp_path / "run"
    shm.mkdir()
    copies = EngineCopies(run / "adapters", shm=shm, dtype="bfloat16")
    for version in range(1, 6):
        folder = copies.write(version, fake_save)
        assert folder.parent.parent == shm and folder.name == f"v{version:06d}"
        assert json.loads((folder / "adapter_config.json").read_text()) == {"dtype": "bfloat16"}
        copies.prune(keep=3)
    assert sorted(p.name for p in copies.root.iterdir()) == ["v000003", "v000004", "v000005"]
    assert not (run / "adapters").exists()  # nothing written to the run folder
    copies.close()
    assert list(shm.iterdir()) == []
    assert EngineCopies(run / "adapters", shm=shm, dtype="float32").dtype is None  # fp32 engine: as saved


def test_a_copy_is_never_seen_half_written(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    copies = EngineCopies(tmp_path / "run" / "adapters", shm=shm)
    copies.write(1, fake_save)
    seen: list[list[str]] = []

    def slow_save(folder: Path, dtype: str | None) -> None:
        with atomic_folder(folder) as tmp:
            (tmp / "adapter_config.json").write_text("{}")
            seen.append(sorted(p.name for p in folder.parent.glob("v*")))  # what an engine could list now
            (tmp / "adapter_model.safetensors").write_bytes(b"y" * 10)

    copies.write(2, slow_save)
    assert seen == [["v000001"]]  # the new version appears only when whole
    assert sorted(p.name for p in copies.path(2).iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert not list(copies.root.glob(".*tmp*"))


def test_no_shm_writes_to_the_run_folder(tmp_path):
    copies = EngineCopies(tmp_path / "run" / "adapters", shm=tmp_path / "missing")
    assert copies.root == tmp_path / "run" / "adapters"
    assert copies.write(1, fake_save) == tmp_path / "run" / "adapters" / "v000001"
    assert EngineCopies(tmp_path / "run" / "adapters", shm=False).root == tmp_path / "run" / "adapters"
    copies.close()
    assert (tmp_path / "run" / "adapters" / "v000001" / "adapter_config.json").is_file()  # the run's own copy stays


def test_a_full_shm_moves_this_and_later_copies_to_the_run_folder(tmp_path, monkeypatch):
    shm, fallback = tmp_path / "shm", tmp_path / "run" / "adapters"
    shm.mkdir()
    copies = EngineCopies(fallback, shm=shm)
    assert copies.write(1, fake_save).parent.parent == shm

    def full(folder: Path, dtype: str | None) -> None:
        if shm in folder.parents:
            raise OSError(28, "No space left on device")
        fake_save(folder, dtype)

    assert copies.write(2, full) == fallback / "v000002"
    assert copies.write(3, fake_save) == fallback / "v000003"
    assert list(shm.iterdir()) == []  # the partial /dev/shm folder went with the switch

    # Too little room before a write: straight to the run folder.
    other = EngineCopies(tmp_path / "run2" / "adapters", shm=shm)
    monkeypatch.setattr(adapters.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(1 << 30, 1 << 30, 1 << 20))
    assert other.write(1, fake_save) == tmp_path / "run2" / "adapters" / "v000001"


def test_a_folder_left_by_a_dead_process_of_the_same_run_is_removed(tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    first = EngineCopies(tmp_path / "run" / "adapters", shm=shm)
    first.write(1, fake_save)  # ... and the process is killed: no close()
    second = EngineCopies(tmp_path / "run" / "adapters", shm=shm)
    assert second.root == first.root and not second.root.exists()
    elsewhere = EngineCopies(tmp_path / "other" / "adapters", shm=shm)
    assert elsewhere.root != first.root  # another run's folder has its own
