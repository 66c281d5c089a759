"""What `kforge eval` evaluates, resolved in one place: a run folder (its newest usable checkpoint, or a step),
a checkpoint or adapter folder, a base model id or path, or a file (or folder) of given kernels."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from kforge.errors import UserError
from kforge.jsonl import CANDIDATE_MAX_BYTES, read_text, too_big
from kforge.problems.record import Problem


class EvalTargetError(UserError):
    pass


@dataclass
class Target:
    """What to evaluate: a base model, optionally with a LoRA adapter folder."""

    model: str
    adapter: str | None = None
    description: str = ""


def resolve_target(spec: str, runs_dir: str = "runs", step: int | None = None) -> tuple[Target, Path | None, list[str]]:
    """A run folder (its latest checkpoint, or `step`), a checkpoint/adapter folder, or a base model id/path.

    The run folder says where its checkpoints are (`kforge.runs.locate`, as for `kforge export`). Returns the
    target, for a run the run's config file (so eval uses the run's model), and the run's newer checkpoints
    that cannot be used. A run folder without its config.yaml would be evaluated with bare defaults (another
    context length, no held-out split): refused."""
    from kforge.runs.locate import is_run_or_adapter, load_run_config, locate, no_run_config

    if not is_run_or_adapter(spec, runs_dir):
        return Target(spec, None, f"base model {spec}"), None, []
    found = locate(spec, runs_dir, step)
    missing = no_run_config(found.run) if found.run is not None else None
    if missing:
        raise EvalTargetError(f"{missing}; the run's model, context length and held-out split are unknown without "
                              f"it: put it back, or evaluate the adapter folder {found.adapter_dir} with --preset "
                              "and --split all")
    skipped = [f"{line}; using step {found.step}" for line in found.skipped]
    config = load_run_config(found.run) if found.run is not None else None  # its config.yaml is there (above)
    if config is not None:
        model = config.model.name
    else:
        model = json.loads((found.adapter_dir / "adapter_config.json").read_text()).get("base_model_name_or_path")
        if not model:
            raise EvalTargetError(f"{found.adapter_dir}: no run config and no base_model_name_or_path in "
                                  "adapter_config.json; evaluate the run folder instead")
    where = found.checkpoint_dir or found.adapter_dir
    description = f"{where}" + (f" (run {found.run.name}, step {found.step})" if found.run is not None else "")
    run_config = found.run.config_path if config is not None and found.run is not None else None
    return Target(model, str(found.adapter_dir), description), run_config, skipped


def target_identity(candidates: Path | None, target: Target) -> str:
    """What was evaluated, as a resolved path where there is one: the same checkpoint reached through the run's
    name, a relative or an absolute path, or its checkpoint folder is the same adapter folder."""
    if candidates is not None:
        return str(Path(candidates).resolve())
    if target.adapter:
        return str(Path(target.adapter).resolve())
    local = Path(target.model).expanduser()
    return str(local.resolve()) if local.exists() else target.model


def load_candidates(path: Path, problems: list[Problem]) -> list[tuple[Problem, int, str]]:
    """Given kernels: a JSONL of {problem, code} (problem = LEVEL/ID or a name), or a folder of .py files
    named after the problems (`19_ReLU.py`, `1_19.py`, `19.py` when one level is selected)."""
    from kforge.problems import find_problem

    items: list[tuple[Problem, int, str]] = []
    counts: dict[str, int] = {}

    def add(spec: str, code: str, where: str) -> None:
        try:
            problem = find_problem(problems, spec)
        except Exception as exc:
            raise EvalTargetError(f"{where}: {exc}") from None
        idx = counts.get(problem.key, 0)
        counts[problem.key] = idx + 1
        items.append((problem, idx, code))

    if path.is_dir():
        for f in sorted(path.glob("*.py")):
            stem = f.stem
            m = re.fullmatch(r"(\d+)_(\d+)", stem)
            code = read_text(f, EvalTargetError, "candidate", "give the kernel's .py source", CANDIDATE_MAX_BYTES)
            add(f"{m.group(1)}/{m.group(2)}" if m else stem, code, str(f))
    elif path.is_file():
        text = read_text(path, EvalTargetError, "--candidates", "give a JSONL of {\"problem\", \"code\"} lines "
                         "or a folder of LEVEL_ID.py files")
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
                spec, code = str(rec["problem"]), rec["code"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise EvalTargetError(f"{path}:{n}: expected a JSON object with 'problem' and 'code'") from None
            over = too_big(len(str(code).encode("utf-8", "surrogatepass")), CANDIDATE_MAX_BYTES)
            if over:
                raise EvalTargetError(f"{path}:{n}: the candidate's code is {over}; give the kernel's source")
            add(spec, code, f"{path}:{n}")
    else:
        raise EvalTargetError(f"--candidates {path}: no such file or folder")
    return items
