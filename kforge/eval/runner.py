"""`kforge eval`: generate kernels for KernelBench-format problems (or take given ones), evaluate them in the
sandboxed pool and write a results file whose numbers mean what KernelBench's mean.

The results file is rewritten atomically after every finished sample, so an interrupted eval loses at most
the samples in flight, and `--resume` continues without redoing finished ones.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import platform
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from kforge.config.schema import KforgeConfig
from kforge.errors import UserError
from kforge.eval.report import SampleOutcome, summarize
from kforge.eval.results import write_results
from kforge.evaluator.verdict import Verdict
from kforge.jsonl import CANDIDATE_MAX_BYTES, read_text, too_big
from kforge.problems.record import Problem

log = logging.getLogger("kforge.eval")


class EvalTargetError(UserError):
    pass


@dataclass
class Target:
    """What to evaluate: a base model, optionally with a LoRA adapter folder."""

    model: str
    adapter: str | None = None
    description: str = ""


def resolve_target(spec: str, runs_dir: str = "runs", step: int | None = None) -> tuple[Target, Path | None]:
    """A run folder (its latest checkpoint, or `step`), a checkpoint/adapter folder, or a base model id/path.

    The run folder says where its checkpoints are (`kforge.runs.locate`, as for `kforge export`). Returns the
    target and, for a run, the run's config file (so eval uses the run's model)."""
    from kforge.runs.locate import is_run_or_adapter, load_run_config, locate

    if not is_run_or_adapter(spec, runs_dir):
        return Target(spec, None, f"base model {spec}"), None
    found = locate(spec, runs_dir, step)
    config = load_run_config(found.run) if found.run is not None and found.run.config_path.is_file() else None
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
    return Target(model, str(found.adapter_dir), description), run_config


def parse_id_range(text: str | None) -> tuple[int | None, int | None]:
    """`1-20`, `5`, `5-` or None."""
    if not text:
        return None, None
    m = re.fullmatch(r"\s*(\d*)\s*(-?)\s*(\d*)\s*", text)
    if not m or (not m.group(1) and not m.group(3)):
        raise EvalTargetError(f"--problems {text!r}: expected an id or a range like 1-20")
    lo = int(m.group(1)) if m.group(1) else None
    hi = int(m.group(3)) if m.group(3) else (lo if not m.group(2) else None)
    return lo, hi


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


# A results file is rewritten after every sample: a candidate's code is kept up to this many characters
# (a real kernel is far smaller), with its length and hash, so one 60 MB file does not make every write 60 MB.
CODE_KEEP_CHARS = 256 * 1024


def kept_code(code: str | None) -> dict[str, Any]:
    """The `code` of a results file's turn, cut at CODE_KEEP_CHARS with its full length and sha256 noted."""
    if code is None or len(code) <= CODE_KEEP_CHARS:
        return {"code": code}
    digest = hashlib.sha256(code.encode("utf-8", "surrogatepass")).hexdigest()
    return {"code": code[:CODE_KEEP_CHARS], "code_chars": len(code), "code_sha256": digest, "code_cut": True}


WRITE_EVERY_S = 2.0  # the results file is rewritten at most this often while verdicts arrive (and at the end)


@dataclass
class EvalRun:
    cfg: KforgeConfig
    problems: list[Problem]
    out_path: Path
    samples: int = 1
    target: Target | None = None
    candidates: list[tuple[Problem, int, str]] | None = None
    devices: list[int] | None = None
    on_progress: Callable[[str, int, int], None] | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # what the numbers mean, kept in every write
    results: dict[tuple[str, int], dict[str, Any]] = field(default_factory=dict)
    _written_at: float = field(default=float("-inf"), repr=False)  # when the results file was last written

    def keep_previous(self, data: dict[str, Any]) -> int:
        """--resume: keep the finished samples of the earlier results file (read and checked by the plan)."""
        for rec in data.get("samples", []):
            self.results[(rec["problem_key"], rec["sample"])] = rec
        return len(self.results)

    def _record(self, problem: Problem, sample: int, turns: list[dict[str, Any]], best: Verdict | None) -> None:
        self.results[(problem.key, sample)] = {
            "problem_key": problem.key, "level": problem.level, "name": problem.name, "sample": sample,
            "turns": turns, "verdict": best.to_dict() if best is not None else None,
        }
        # The whole file (its summary over every sample) is written again each time: once per sample made
        # a 256-sample eval write it 256 times in a row when a batch's verdicts came back together.
        if time.monotonic() - self._written_at >= WRITE_EVERY_S:
            self.write()

    def outcomes(self) -> list[SampleOutcome]:
        out = []
        for rec in self.results.values():
            v = Verdict.from_dict(rec["verdict"]) if rec.get("verdict") else None
            first = rec["turns"][0].get("verdict") if rec.get("turns") else None
            out.append(SampleOutcome(rec["problem_key"], rec["level"], v, Verdict.from_dict(first) if first else None))
        return out

    def summary(self) -> dict[str, Any]:
        ks = tuple(k for k in (1, 5, 10) if k <= self.samples) or (1,)
        return summarize(self.outcomes(), ks)

    def write(self) -> None:
        ordered = sorted(self.results.values(), key=lambda r: (r["level"], int(r["problem_key"].split("/")[1]), r["sample"]))
        doc = {
            "summary": self.summary(),
            "target": self.target.description if self.target else "given candidates",
            "model": self.target.model if self.target else None,
            "adapter": self.target.adapter if self.target else None,
            "backend": self.cfg.dataset.backend,
            "turns": self.cfg.turns,
            "samples_per_problem": self.samples,
            "machine": platform.node(),
            "time": time.time(),
            "config": self.cfg.model_dump(mode="json"),
            **self.meta,
            "samples": ordered,
        }
        write_results(self.out_path, doc)
        self._written_at = time.monotonic()

    def _tell(self, stage: str, done: int = 0, total: int = 0) -> None:
        """Progress to the caller; a stage without counts (total 0) says what runs before the first verdict."""
        if self.on_progress:
            self.on_progress(stage, done, total)

    async def _evaluate_given(self, pool: Any) -> None:
        todo = [(p, i, code) for p, i, code in (self.candidates or []) if (p.key, i) not in self.results]
        done = 0
        self._tell(f"evaluating: {len(todo)} kernels")

        async def one(p: Problem, i: int, code: str) -> None:
            nonlocal done
            verdict = await pool.evaluate(p, code, self.cfg.dataset.backend)
            self._record(p, i, [{"turn": 1, **kept_code(code), "verdict": verdict.to_dict()}], verdict)
            done += 1
            if self.on_progress:
                self.on_progress("evaluate", done, len(todo))

        await asyncio.gather(*(one(*item) for item in todo))

    async def _generate_and_evaluate(self, pool: Any) -> None:
        from kforge.credit.rewards import score_trajectories
        from kforge.policy.runner import EpisodeRunner
        from kforge.rag import retriever_for
        from kforge.rollout.factory import make_backend

        assert self.target is not None
        jobs = [(p, s) for p in self.problems for s in range(self.samples) if (p.key, s) not in self.results]
        if not jobs:
            return
        self._tell(f"loading {self.target.model}" + (f" with {self.target.adapter}" if self.target.adapter else ""))
        backend = make_backend(self.cfg, self.devices)
        try:
            if self.target.adapter:
                backend.load_adapter(self.target.adapter, 1)
            # Every sample of an eval is judged on its own: no verdict cache between samples.
            runner = EpisodeRunner.from_config(self.cfg, backend, pool.evaluate, retriever_for(self.cfg.dataset),
                                               cache=False)
            by_key = {p.key: p for p in self.problems}
            done = 0
            total = len(jobs) * self.cfg.turns

            def on_turn(traj: Any, turn: Any) -> None:
                nonlocal done
                done += 1
                if self.on_progress:
                    self.on_progress("generate+evaluate", done, total)

            # Samples are recorded per batch of problems so an interruption keeps finished batches. An engine that
            # batches requests itself (vLLM) gets them all at once: in hf-sized chunks it sat idle while each
            # chunk's verdicts came back (on an H200 a 120-sample gate did 20 samples in 4.5 min; all at once, 120 in 2).
            chunk = len(jobs) if getattr(backend, "concurrent", False) else max(1, self.cfg.rollout.hf_batch_size)
            for start in range(0, len(jobs), chunk):
                if done == 0:  # until the first verdict, the line says what the engine is doing
                    self._tell(f"generating: {len(jobs[start : start + chunk])} requests")
                rollouts = await runner.run(jobs[start : start + chunk], 1, self.cfg.dataset.seed, on_turn=on_turn)
                score_trajectories(rollouts.trajectories, self.cfg.reward, self.cfg.episode.thinking)
                for traj in rollouts.trajectories:
                    turns = [{"turn": t.index + 1, **kept_code(t.candidate.code if t.candidate else None),
                              "response": t.response_text, "score": t.score,
                              "verdict": t.verdict.to_dict() if t.verdict else None} for t in traj.turns]
                    self._record(by_key[traj.problem_key], traj.group_index, turns, traj.best_verdict)
                self.write()  # every finished batch is on disk before the next starts
        finally:
            backend.close()

    def run(self) -> dict[str, Any]:
        from kforge.evaluator import EvalPool

        async def main() -> None:
            self._tell("starting the evaluator")
            with EvalPool(self.cfg.evaluator, devices=self.devices or None) as pool:
                if self.candidates is not None:
                    await self._evaluate_given(pool)
                else:
                    await self._generate_and_evaluate(pool)

        asyncio.run(main())
        self.write()
        return self.summary()
