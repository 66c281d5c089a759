"""Everything one `kforge eval` needs, built in one place from the request: the config (layered like
`kforge train`'s: preset or the run's config < --config < KFORGE_* < key=value, the command's flags being
key=value overrides too), the target, the problems of the split, given kernels, GPUs, the results file
and what the numbers mean. `kforge eval` only parses, calls `build_eval` and prints."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kforge.config.loader import resolve
from kforge.config.schema import DatasetConfig, KforgeConfig
from kforge.errors import UserError
from kforge.eval.parts import EvalParts, build_parts
from kforge.eval.runner import EvalRun
from kforge.eval.target import Target, load_candidates, resolve_target, target_identity
from kforge.modelio import fit_context
from kforge.problems.record import Problem

log = logging.getLogger("kforge.eval")

SPLITS = ("test", "train", "all")


class EvalSetupError(UserError):
    """The eval cannot start as asked; the message is one line for the user."""


@dataclass
class EvalRequest:
    """What the user asked for. `overrides` already holds the config flags as key=value."""

    target: str | None = None
    overrides: list[str] = field(default_factory=list)
    preset: str | None = None
    config: Path | None = None
    split: str | None = None
    samples: int = 1
    out: Path | None = None
    candidates: Path | None = None
    step: int | None = None
    resume: bool = False
    gpus: str | None = None
    runs_dir: str = "runs"
    dry_run: bool = False  # lists the plan only: an existing results file is no obstacle


@dataclass
class EvalPlan:
    """Everything resolved and checked before any model or worker starts (`build_eval`)."""

    cfg: KforgeConfig
    target: Target | None  # None: given kernels
    split: str
    selected: list[Problem]
    trained: set[str]  # keys of the problems the run trained on
    blocked: list[tuple[Problem, str]]  # selected problems that cannot run here, and why
    given: list[tuple[Problem, int, str]] | None  # (problem, sample index, code) of given kernels
    devices: list[int] | None
    out: Path
    meta: dict[str, Any]
    samples: int
    skipped: list[str] = field(default_factory=list)  # a run's newer checkpoints that cannot be used
    previous: dict[str, Any] | None = None  # --resume: the results file as checked, its finished samples kept

    def make_run(self) -> EvalRun:
        return EvalRun(self.cfg, self.selected, self.out, samples=self.samples, target=self.target,
                       candidates=self.given, meta=self.meta)

    def parts(self, run: EvalRun, tell: Callable[[str], None] = lambda stage: None) -> EvalParts:
        """The pool, and the target's model only when `run` has samples left to generate."""
        return build_parts(self.cfg, self.target, self.devices, self.given is None and bool(run.pending()), tell)


def parse_id_range(text: str | None) -> tuple[int | None, int | None]:
    """`1-20`, `5`, `5-` or None."""
    if not text:
        return None, None
    m = re.fullmatch(r"\s*(\d*)\s*(-?)\s*(\d*)\s*", text)
    if not m or (not m.group(1) and not m.group(3)):
        raise EvalSetupError(f"--problems {text!r}: expected an id or a range like 1-20")
    lo = int(m.group(1)) if m.group(1) else None
    hi = int(m.group(3)) if m.group(3) else (lo if not m.group(2) else None)
    return lo, hi


def flag_overrides(level: list[int] | None = None, problems: str | None = None, source: str | None = None,
                   backend: str | None = None, temperature: float | None = None, turns: int | None = None,
                   baseline: Path | None = None, user: list[str] = ()) -> list[str]:
    """The command's config flags as key=value overrides (layered after the user's own, as in train).
    Without --turns an eval is single-turn unless an override sets the episode."""
    out: list[str] = []
    if source:
        out.append(f"dataset.source={source}")
    if level:
        out.append(f"dataset.level=[{','.join(str(x) for x in level)}]")
    if problems is not None:
        lo, hi = parse_id_range(problems)
        out += [f"dataset.start_problem={'null' if lo is None else lo}",
                f"dataset.end_problem={'null' if hi is None else hi}"]
    if backend:
        out.append(f"dataset.backend={backend}")
    if temperature is not None:
        out.append(f"rollout.temperature={temperature}")
    if turns is not None or not any(o.lstrip("-").startswith("episode.") for o in user):
        turns = turns or 1
        out += [f"episode.max_turns={turns}", f"episode.mode={'multi_turn' if turns > 1 else 'single_turn'}"]
    if baseline is not None:
        if not baseline.is_file():
            raise EvalSetupError(f"--baseline {baseline}: no such file")
        out.append(f"evaluator.baseline_file={baseline}")
    return out


def build_eval(req: EvalRequest) -> EvalPlan:
    """Resolve, select and check everything before any model or worker starts; EvalSetupError otherwise."""
    from kforge.problems import problems_from_config, split_runnable

    if req.split is not None and req.split not in SPLITS:
        raise EvalSetupError(f"--split {req.split!r}: expected one of {', '.join(SPLITS)}")
    target, run_config, skipped = None, None, []
    if req.candidates is None:
        if not req.target:
            raise EvalSetupError("give a TARGET (run folder, adapter folder or model) or --candidates FILE")
        target, run_config, skipped = resolve_target(req.target, req.runs_dir, req.step)
    preset = None if run_config else req.preset
    base = config_file = req.config or run_config
    # The split is the one the run (or preset) drew from its own selection, before this command's overrides.
    split_cfg = resolve(preset, base, []).config
    resolved = resolve(preset, config_file, req.overrides)
    if target is not None:  # the model generating is the target's (a run's, an adapter's base, or the one named)
        resolved = fit_context(resolved.derive("eval target", {"model": {"name": target.model}}), log.info)
    cfg = resolved.config
    split = req.split or ("test" if run_config is not None else "all")
    selected = problems_from_config(cfg.dataset)  # a ProblemSourceError or EvalTargetError says what is wrong
    selected, trained = apply_split(selected, split, split_cfg.dataset, run_config is not None)
    selected, blocked = split_runnable(selected)
    given = load_candidates(req.candidates, selected) if req.candidates is not None else None
    if not selected:
        raise EvalSetupError("no problems selected: check --level, --problems, --source and --split")
    if given is not None and not given:
        raise EvalSetupError(f"--candidates {req.candidates}: no kernels in it (a JSONL of {{problem, code}} "
                             "or a folder of .py files named after the problems)")
    devices = parse_devices(req.gpus, generating=req.candidates is None)
    out = req.out or default_out(req, target, run_config, split)
    what = str(req.candidates) if req.candidates is not None else target.description
    selection = {"target": what, "target_path": target_identity(req.candidates, target), "split": split,
                 "problems": sorted(p.key for p in selected),
                 "generation": generation_settings(cfg, req.samples) if req.candidates is None else None}
    if not req.dry_run:
        from kforge.space import check_writable

        check_writable(out.parent, f"results file {out}: its folder")
    previous = None
    if out.exists() and not req.dry_run:
        if not req.resume:
            raise EvalSetupError(f"{out} exists; pass --resume to continue it or --out to write elsewhere")
        previous = check_resumable(out, selection)
    from kforge.eval.meta import describe

    meta = {**describe(cfg, split, selected, trained, devices, blocked), "selection": selection}
    return EvalPlan(cfg, target, split, selected, trained, blocked, given, devices, out, meta, req.samples, skipped,
                    previous)


def default_out(req: EvalRequest, target: Target, run_config: Path | None, split: str) -> Path:
    """Into the run folder for a run; otherwise a name that says what was evaluated on which split."""
    if run_config is not None:
        step = re.search(r"step[_ ](\d+)", target.description)
        return run_config.parent / f"eval_results-step{int(step.group(1)) if step else 'last'}-{split}.json"
    what = Path(req.candidates).name if req.candidates is not None else str(req.target)
    slug = re.sub(r"[^A-Za-z0-9.]+", "_", what).strip("_") or "model"
    return Path(f"eval_results-{slug}-{split}.json")


def generation_settings(cfg: KforgeConfig, samples: int) -> dict[str, Any]:
    """The settings that change what a sample is: results made under others cannot be averaged with these."""
    ro = cfg.rollout
    return {"samples": samples, "turns": cfg.turns, "temperature": ro.temperature, "top_p": ro.top_p,
            "top_k": ro.top_k, "max_tokens": ro.max_tokens}


def check_resumable(out: Path, selection: dict[str, Any]) -> dict[str, Any]:
    """--resume only into a file made by the same target, split, problem selection and generation settings;
    the file as read (its samples are kept from this one read)."""
    from kforge.eval.results import ResultsFileError, read_results

    try:
        doc = read_results(out)
    except ResultsFileError as exc:
        raise EvalSetupError(f"{exc}; move it away or pick another --out") from None
    before = doc.get("selection")
    if not isinstance(before, dict):
        raise EvalSetupError(f"{out} does not say which target, split and problems it holds; "
                             "resume only into a file this version wrote, or pick another --out")
    if "target_path" not in before or "generation" not in before:
        raise EvalSetupError(f"{out} does not say which resolved target and generation settings it holds (an "
                             "older kforge wrote it); pick another --out")
    if before.get("target_path") != selection["target_path"]:
        raise EvalSetupError(f"cannot resume {out}: it holds target {before.get('target')!r} "
                             f"({before.get('target_path')}), this eval is {selection['target']!r} "
                             f"({selection['target_path']}); pick another --out")
    if before.get("split") != selection["split"]:
        raise EvalSetupError(f"cannot resume {out}: it holds split {before.get('split')!r}, this eval is "
                             f"{selection['split']!r}; pick another --out")
    had_gen, now_gen = before.get("generation") or {}, selection["generation"] or {}
    changed = [f"{key} {had_gen.get(key)!r} there, {now_gen.get(key)!r} here"
               for key in sorted(set(had_gen) | set(now_gen)) if had_gen.get(key) != now_gen.get(key)]
    if changed:
        raise EvalSetupError(f"cannot resume {out}: its samples were made with other generation settings "
                             f"({'; '.join(changed)}); use the same --samples, --turns, temperature and "
                             "max_tokens, or pick another --out")
    if before.get("problems") != selection["problems"]:
        had, now = set(before.get("problems") or []), set(selection["problems"])
        diff = sorted(had - now)[:3] or sorted(now - had)[:3]
        raise EvalSetupError(f"cannot resume {out}: it holds another problem selection ({len(had)} problems, this "
                             f"eval {len(now)}; e.g. {', '.join(diff)} differs); pick another --out")
    return doc


def apply_split(selected: list[Problem], split: str, split_dataset: DatasetConfig,
                is_run: bool) -> tuple[list[Problem], set[str]]:
    """(problems of `split`, the keys the run trains on). Held out = every problem the run does not train on."""
    from kforge.problems import ProblemSourceError, training_keys

    if split == "all" and not is_run:
        return selected, set()  # a model with no run behind it has trained on none of them
    if selected and all(p.split is not None for p in selected):
        # The rows declare their split (a generated curriculum): the same whichever config drew it.
        trained = {p.key for p in selected if p.split == "train"}
    else:
        try:
            trained = training_keys(split_dataset)
        except ProblemSourceError as exc:
            raise ProblemSourceError(f"cannot rebuild the run's train/test split ({exc}); use --split all") from None
    if split == "test":
        kept = [p for p in selected if p.key not in trained]
        if not kept:
            raise ProblemSourceError(
                "none of the selected problems is held out from the run (its test split is empty or not selected): "
                "use --split train or --split all, or select other problems"
            )
        return kept, trained
    if split == "train":
        return [p for p in selected if p.key in trained], trained
    return selected, trained


def parse_devices(text: str | None, generating: bool) -> list[int] | None:
    """Logical GPU indices for this eval. vLLM splits the model over every GPU it gets (tensor parallel), and
    7B/8B attention head counts do not divide by 3 or 6: generation takes one GPU unless told otherwise."""
    from kforge.gpus import check_indices, visible_ids

    visible = visible_ids()
    if text is None:
        if not visible:
            return None
        return [0] if generating else list(range(len(visible)))
    try:
        ids = [int(x) for x in re.split(r"[,\s]+", text.strip()) if x]
    except ValueError:
        raise EvalSetupError(f"--gpus {text!r}: expected GPU indices like 0 or 2,3") from None
    if not ids:
        raise EvalSetupError(f"--gpus {text!r}: expected GPU indices like 0 or 2,3")
    check_indices(ids, len(visible), f"--gpus {text!r}: GPU")
    return ids
