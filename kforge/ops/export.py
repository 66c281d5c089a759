"""`kforge export`: a run's adapter as a clean PEFT folder, or the base model with the adapter merged in.

The output loads without kforge: an adapter folder with PEFT (`PeftModel.from_pretrained`) or vLLM
(`--enable-lora`), a merged folder with `transformers` or vLLM like any Hugging Face model. The folder is
written under a temporary name beside DIR and renamed into place only when complete.
"""

from __future__ import annotations

import json
import os
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from kforge.config.schema import KforgeConfig
from kforge.errors import UserError
from kforge.modelio import peft_wrapping
from kforge.runs.folder import RunFolder
from kforge.runs.locate import ADAPTER_CONFIG, ADAPTER_WEIGHTS, find_adapter, load_run_config, locate

__all__ = ["ExportError", "ExportSource", "export_adapter", "export_merged", "find_adapter", "locate_source"]

CARD = "README.md"


class ExportError(UserError):
    """Bad export input; the message is one line saying what, where and what to do."""


@dataclass
class ExportSource:
    """What is exported: an adapter folder plus what is known about where it came from."""

    adapter_dir: Path
    config: KforgeConfig | None = None
    run: RunFolder | None = None
    checkpoint_dir: Path | None = None
    step: int | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)  # newer checkpoints that cannot be used, naming the file

    @property
    def adapter_config(self) -> dict[str, Any]:
        return json.loads((self.adapter_dir / ADAPTER_CONFIG).read_text())

    @property
    def base_model(self) -> str:
        """The config's model name (hub id, folder or pkg:), else what PEFT recorded in the adapter."""
        if self.config is not None:
            return self.config.model.name
        base = self.adapter_config.get("base_model_name_or_path")
        if not base:
            raise ExportError(f"{self.adapter_dir}: no run config and no base_model_name_or_path in "
                              f"{ADAPTER_CONFIG}; export from the run folder instead")
        return str(base)

    def describe(self) -> str:
        where = self.checkpoint_dir or self.adapter_dir
        return f"{where}" + (f" (run {self.run.name}, step {self.step})" if self.run is not None else "")


# --------------------------------------------------------------------------------------------- locate


def locate_source(spec: str, runs_dir: str | Path = "runs", step: int | None = None) -> ExportSource:
    """A run (name or folder: its last checkpoint, or `step`), a checkpoint folder, or an adapter folder;
    the run folder says where its checkpoints are (`kforge.runs.locate`)."""
    found = locate(spec, runs_dir, step)  # a LocateError or RunNotFound says what is there instead
    run = found.run
    config = load_run_config(run) if run is not None and run.config_path.is_file() else None
    metrics = {}
    if run is not None and found.step is not None:
        metrics = next((m for m in reversed(run.metrics()) if m.get("step") == found.step), {})
    return ExportSource(found.adapter_dir, config, run, found.checkpoint_dir, found.step, metrics, found.skipped)


# ----------------------------------------------------------------------------------------------- write


def _looks_like_export(folder: Path) -> bool:
    return (folder / ADAPTER_CONFIG).is_file() or (folder / "config.json").is_file()


@contextmanager
def staged_output(out: Path, force: bool) -> Iterator[Path]:
    """A temporary folder that replaces `out` when the block succeeds.

    A non-empty `out` is replaced only with `force`, and only when it holds an earlier export (an
    adapter_config.json or config.json at its top): `--force` must never wipe an unrelated folder.
    """
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ExportError(f"--out {out} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise ExportError(f"--out {out} is not empty; pass --force to replace it or choose another folder")
        if not _looks_like_export(out):
            raise ExportError(f"--out {out} holds files that are not a model export; --force only replaces an "
                              "earlier export: choose an empty folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _readable(tmp)
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        os.rename(out, old)
    os.rename(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def _readable(folder: Path) -> None:
    """Files as the umask allows (some writers create 0600 files; an export is meant to be shared)."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~umask)


def _copy_adapter(src: Path, dst: Path) -> dict[str, Any]:
    """adapter_config.json + adapter_model.safetensors (converted when the source has only a .bin)."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / ADAPTER_CONFIG).read_text())
    if (src / ADAPTER_WEIGHTS).is_file():
        shutil.copyfile(src / ADAPTER_WEIGHTS, dst / ADAPTER_WEIGHTS)
    else:
        import torch

        state = torch.load(src / "adapter_model.bin", map_location="cpu", weights_only=True)
        save_file({k: v.contiguous() for k, v in state.items()}, str(dst / ADAPTER_WEIGHTS))
    weights = load_file(str(dst / ADAPTER_WEIGHTS))
    if not any("lora_" in k for k in weights):
        raise ExportError(f"{src}: the adapter weights hold no LoRA tensors; is it a LoRA adapter?")
    (dst / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return config


_CARD_METRICS = (("reward/mean", "mean reward"), ("rate/correct", "correct rate"), ("rate/compiled", "compile rate"),
                 ("fast_1", "fast_1"), ("eval/fast_1", "held-out fast_1"), ("eval/fast_0", "held-out fast_0"))


def model_card(source: ExportSource, merged: bool, out: Path, dtype: str | None = None) -> str:
    acfg = source.adapter_config
    base = source.base_model
    cfg = source.config
    targets = acfg.get("target_modules") or []
    if isinstance(targets, str):
        targets = [targets]
    rows = [("base model", f"`{base}`"),
            ("LoRA", f"rank {acfg.get('r')}, alpha {acfg.get('lora_alpha')}, targets {', '.join(map(str, targets))}")]
    if merged:
        rows.append(("weights", f"LoRA merged into the base (PEFT merge_and_unload), {dtype or 'model dtype'}"))
    if source.run is not None:
        rows.append(("run", f"`{source.run.name}`" + (f", preset `{cfg.preset}`" if cfg is not None and cfg.preset else "")))
    if source.step is not None:
        rows.append(("step", str(source.step)))
    if cfg is not None:
        rows.append(("training", f"{cfg.learner.loss_fn}, {cfg.episode.mode} ({cfg.turns} turn(s)), "
                                 f"group {cfg.dataset.group_size}, backend {cfg.dataset.backend}"))
    for key, label in _CARD_METRICS:
        value = source.metrics.get(key)
        if isinstance(value, (int, float)):
            rows.append((label + f" at step {source.step}", f"{value:.4f}"))
    front = {"base_model": base if not base.startswith("pkg:") else None,
             "library_name": "transformers" if merged else "peft",
             "tags": ["kforge", "lora", "grpo", "gpu-kernels", cfg.dataset.backend if cfg else "triton"]}
    front = {k: v for k, v in front.items() if v is not None}
    lines = ["---", yaml.safe_dump(front, sort_keys=False).strip(), "---", ""]
    title = f"{source.run.name} step {source.step}" if source.run is not None else out.name
    lines += [f"# {title}" + (" (merged)" if merged else " (LoRA adapter)"), "",
              "Trained with kforge: multi-turn GRPO on KernelBench-format problems, rewards from a sandboxed "
              "kernel evaluator (compile, correctness, speed).", "",
              "| | |", "| --- | --- |"] + [f"| {k} | {v} |" for k, v in rows] + [""]
    if base.startswith("pkg:") and not merged:
        lines += [f"The base model comes from the Python package `{base[4:]}` (a GGUF file); kforge loads it "
                  "as a dense Hugging Face model. Load the same base the same way before applying the adapter.", ""]
    if merged:
        lines += ["## Use", "", "```python", "from transformers import AutoModelForCausalLM, AutoTokenizer",
                  f'model = AutoModelForCausalLM.from_pretrained("{out}")',
                  f'tokenizer = AutoTokenizer.from_pretrained("{out}")', "```", "",
                  f"vLLM: `vllm serve {out}`", ""]
    else:
        # A pkg: base is no hub id; the dense copy kforge made of it is what PEFT recorded.
        loadable = acfg.get("base_model_name_or_path") or base if base.startswith("pkg:") else base
        rank = int(acfg.get("r") or 8)
        vllm_rank = next((r for r in (8, 16, 32, 64, 128, 256, 320, 512) if r >= rank), rank)
        lines += ["## Use", "", "```python", "from transformers import AutoModelForCausalLM",
                  "from peft import PeftModel", f'base = AutoModelForCausalLM.from_pretrained("{loadable}")',
                  f'model = PeftModel.from_pretrained(base, "{out}")', "```", "",
                  f"vLLM: `vllm serve {loadable} --enable-lora --max-lora-rank {vllm_rank} --lora-modules kforge={out}`", ""]
    return "\n".join(lines)


def export_adapter(source: ExportSource, out: Path, force: bool = False) -> Path:
    out = Path(out)
    with staged_output(out, force) as tmp:
        _copy_adapter(source.adapter_dir, tmp)
        (tmp / CARD).write_text(model_card(source, merged=False, out=out))
    return out


def export_merged(source: ExportSource, out: Path, force: bool = False, dtype: str | None = None,
                  device: str = "cpu") -> Path:
    """Base + adapter merged with PEFT, saved as safetensors with tokenizer and generation config.

    GGUF bases come in through kforge.modelio's dense copy, so `save_pretrained` writes plain tensors.
    The model is loaded in the target dtype (model.dtype unless `dtype` is given) and never 4-bit: merged
    weights must be dense.
    """
    import torch
    from peft import PeftModel

    from kforge.modelio import load_causal_lm, load_tokenizer, resolve_model

    cfg = source.config
    dtype_name = dtype or (cfg.model.dtype if cfg is not None else "auto")
    trust = bool(cfg.model.trust_remote_code) if cfg is not None else False
    out = Path(out)
    # Check the output folder before spending time on the model.
    with staged_output(out, force) as tmp:
        ref = resolve_model(source.base_model, cfg.model.gguf_file if cfg is not None else None)
        tokenizer = load_tokenizer(ref, cfg.model.chat_template if cfg is not None else None, trust)
        # device=None: load_causal_lm keeps the asked dtype (it turns bf16 into fp32 only for device="cpu").
        base = load_causal_lm(ref, dtype_name, device=None, load_in_4bit=False, trust_remote_code=trust)
        if device != "cpu":
            base = base.to(device)
        with peft_wrapping():
            model = PeftModel.from_pretrained(base, str(source.adapter_dir))
        merged = model.merge_and_unload()
        if dtype_name in ("bfloat16", "float16", "float32"):
            merged = merged.to(getattr(torch, dtype_name))
        merged = merged.to("cpu")
        gen = merged.generation_config
        if gen is not None:
            if gen.eos_token_id is None and tokenizer.eos_token_id is not None:
                gen.eos_token_id = tokenizer.eos_token_id
            if gen.pad_token_id is None and tokenizer.pad_token_id is not None:
                gen.pad_token_id = tokenizer.pad_token_id
        merged.config.use_cache = True
        merged.save_pretrained(str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        (tmp / CARD).write_text(model_card(source, merged=True, out=out, dtype=str(merged.dtype).replace("torch.", "")))
    return out
