"""`kforge sft`: the supervised warm start (kforge.train.sft): parse, check, train with a progress bar, print."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from kforge.cli.common import ConfigOpt, OverridesArg, PresetOpt, ask_the_hub_once, load_config
from kforge.ui.console import console, fail, progress_bar


def sft(
    overrides: Optional[list[str]] = OverridesArg,
    preset: Optional[str] = PresetOpt,
    config: Optional[Path] = ConfigOpt,
    data: Optional[Path] = typer.Option(None, "--data", help='JSONL of {"problem": KEY or "prompt": TEXT, "code": '
                                        "SOLUTION}; default: the built-in problems' reference solutions"),
    problems: Optional[str] = typer.Option(None, "--problems", help="only these problems of the set (comma-separated "
                                           "LEVEL/ID keys or names)"),
    out: Optional[Path] = typer.Option(None, "--out", help="adapter folder to write (default: sft-PRESET-DATE); "
                                       "must not exist"),
    epochs: int = typer.Option(3, "--epochs", min=1, help="passes over the set"),
    batch_size: int = typer.Option(4, "--batch-size", min=1, help="pairs per optimiser step"),
    lr: Optional[float] = typer.Option(None, "--lr", min=0.0, help="learning rate (default: learner.learning_rate)"),
    holdout: float = typer.Option(0.0, "--holdout", min=0.0, max=0.9, help="share of the set's problems kept out "
                                  "of training for a held-out loss per epoch"),
) -> None:
    """Supervised LoRA warm start on (problem, solution) pairs, prompted as `kforge train` prompts; writes an
    adapter folder for `kforge train ... model.checkpoint=DIR` and `kforge eval DIR`."""
    from kforge.learner.lora import LearnerError
    from kforge.train import sft as warm

    cfg = load_config(preset or "default", config, overrides).config
    ask_the_hub_once()  # the model, and a hub problem source
    folder = out or Path(f"sft-{cfg.preset or 'run'}-{time.strftime('%Y%m%d-%H%M%S')}")
    if folder.exists():
        raise fail(f"--out {folder} exists; kforge sft writes a new folder: pick another --out or move it away")
    held_out = warm.held_out_problems(cfg)
    if data is None:
        pairs, left_out = warm.default_pairs(held_out)
        if left_out:
            console.print(f"left out the solutions of {len(left_out)} problems this config holds out: "
                          f"{', '.join(p.name for p in left_out)}", highlight=False, soft_wrap=True)
    else:
        pairs = warm.read_pairs(data, cfg)
    pairs = warm.only(pairs, problems)
    warm.refuse_leaks(pairs, held_out, cfg)
    train_pairs, heldout_pairs = warm.split_pairs(pairs, holdout, cfg.dataset.seed)
    run_cfg = warm.sft_config(cfg, lr)
    console.print(f"{len(train_pairs)} training pairs, {len(heldout_pairs)} held out; {epochs} epochs of batches of "
                  f"{batch_size}, learning rate {run_cfg.learner.learning_rate:g}, LoRA rank {cfg.lora.rank}",
                  highlight=False, soft_wrap=True)
    with progress_bar() as progress:
        task = progress.add_task("sft", total=None)

        def on_progress(stage: str, done: int, total: int) -> None:
            progress.update(task, description=stage, completed=done, total=total)
            if not console.is_terminal:
                print(f"{stage}: step {done}/{total}", flush=True)

        def say(text: str) -> None:
            progress.console.print(text, highlight=False, soft_wrap=True)

        try:
            warm.run_sft(run_cfg, train_pairs, heldout_pairs, folder, epochs, batch_size, on_progress, say)
        except LearnerError as exc:  # the learner's own failure may carry a traceback: its first line
            raise fail(str(exc).splitlines()[0]) from None
    console.print(f"wrote {folder}: start RL from it with `kforge train --preset {cfg.preset or 'default'} "
                  f"model.checkpoint={folder}`", highlight=False, soft_wrap=True)

