"""`kforge export`: a run's adapter as a clean PEFT folder, or a merged Hugging Face model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from kforge.ui.console import console, fail


def export(
    source: str = typer.Argument(..., help="run name or folder, a checkpoint folder, or an adapter folder"),
    out: Path = typer.Option(..., "--out", "-o", help="folder to write (must be empty, or use --force)"),
    merge: bool = typer.Option(False, "--merge", help="merge the LoRA into the base and write a full model"),
    step: Optional[int] = typer.Option(None, "--step", help="the run's checkpoint at this step (default: the last)"),
    force: bool = typer.Option(False, "--force", help="replace an earlier export in --out"),
    dtype: Optional[str] = typer.Option(None, "--dtype", help="merged weights: bfloat16, float16 or float32 "
                                        "(default: the run's model.dtype)"),
    device: str = typer.Option("cpu", "--device", help="where to merge (cpu, or cuda for big models)"),
    runs_dir: str = typer.Option("runs", "--runs-dir", help="folder holding the run folders"),
) -> None:
    """Write the adapter (adapter_config.json + adapter_model.safetensors + README) or, with --merge, the base
    model with the adapter merged in (safetensors, tokenizer, generation config) for transformers or vLLM."""
    from kforge.modelio import ModelLoadError
    from kforge.ops.export import export_adapter, export_merged, locate_source
    from kforge.space import check_writable, write_failure

    if dtype is not None and dtype not in ("bfloat16", "float16", "float32"):
        raise fail(f"--dtype {dtype}: give bfloat16, float16 or float32")
    try:
        check_writable(out, "--out")  # before a model is loaded to merge
        src = locate_source(source, runs_dir, step)
        for line in src.skipped:
            console.print(f"warning: {line}; using step {src.step}", highlight=False, soft_wrap=True)
        console.print(f"exporting {src.describe()}", highlight=False, soft_wrap=True)
        if merge:
            export_merged(src, out, force=force, dtype=dtype, device=device)
        else:
            export_adapter(src, out, force=force)
    except OSError as exc:  # the disk filled up while writing: the staged folder is already gone
        why = write_failure(exc)
        if why is None:
            raise
        raise fail(f"{why}; nothing was written to {out}: free space there and export again", code=1) from None
    except ModelLoadError as exc:
        raise fail(f"base model: {exc}", code=1) from None
    what = "merged model" if merge else "LoRA adapter"
    console.print(f"wrote {what} to {out}", highlight=False, soft_wrap=True)
    if merge:
        console.print(f"load it with AutoModelForCausalLM.from_pretrained({str(out)!r}) or `vllm serve {out}`",
                      highlight=False, soft_wrap=True)
    else:
        console.print(f"load it with PeftModel.from_pretrained(base, {str(out)!r}); base model: {src.base_model}",
                      highlight=False, soft_wrap=True)
