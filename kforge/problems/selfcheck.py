"""Check that reference solutions really solve their problems: the built-in suite's own test.

Run it in a fresh process, because a bad kernel can take the interpreter down with it:

    python -m kforge.problems.selfcheck [--device cpu|cuda] [--seeds 0 1] [--problems 1/3 2/1]

On the CPU it sets TRITON_INTERPRET=1 before Triton is imported (the interpreter reads it once). For each
problem and seed it builds the reference and the solution from the same seed, copies the reference's
weights into the solution (strictly: parameter names and shapes must agree), and compares outputs with
fp32 tolerances. It also checks what makes the problem worth solving: inputs are created on the CPU and
take both signs, the output changes with the seed, and the solution launches at least one Triton kernel.
Prints one JSON object per problem; exit status 1 when any check fails.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Sequence

from kforge.problems.record import Problem

if TYPE_CHECKING:
    import torch

ATOL = 1e-4
RTOL = 1e-4


@dataclass
class SolutionCheck:
    key: str
    name: str
    ok: bool
    max_abs_error: float = 0.0
    kernel_launches: int = 0
    failures: list[str] = field(default_factory=list)


def check_solutions(
    problems: Sequence[Problem], device: str = "cpu", seeds: Sequence[int] = (0, 1)
) -> list[SolutionCheck]:
    """Check every problem's `solution` against its reference (call from a process you can lose)."""
    if len(set(seeds)) < 2:
        raise ValueError("give at least two different seeds: one seed cannot show the output depends on inputs")
    _prepare_triton(device)
    results = []
    with tempfile.TemporaryDirectory(prefix="kforge-selfcheck-") as scratch:
        for problem in problems:
            results.append(_check_one(problem, device, seeds, Path(scratch)))
    return results


def _prepare_triton(device: str) -> None:
    if device != "cpu":
        return
    if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set: run the check in a fresh process")
    os.environ["TRITON_INTERPRET"] = "1"


def _check_one(problem: Problem, device: str, seeds: Sequence[int], scratch: Path) -> SolutionCheck:
    result = SolutionCheck(key=problem.key, name=problem.name, ok=False)
    if not problem.solution:
        result.failures.append("no reference solution")
        return result
    try:
        stem = f"l{problem.level}_p{problem.problem_id}"
        reference = _import_file(scratch / f"problem_{stem}.py", problem.code)
        solution = _import_file(scratch / f"solution_{stem}.py", problem.solution)
        launches = _count_launches(solution)
        outputs = [_compare_once(reference, solution, device, seed, result, launches) for seed in seeds]
    except Exception as exc:  # report it as this problem's failure and go on with the others
        result.failures.append(f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}")
        return result
    import torch

    if all(torch.equal(outputs[0], other) for other in outputs[1:]):
        result.failures.append("the reference output is the same for every seed: inputs do not matter")
    result.kernel_launches = launches["count"]
    result.ok = not result.failures
    return result


def _compare_once(
    reference: ModuleType, solution: ModuleType, device: str, seed: int, result: SolutionCheck, launches: dict
) -> torch.Tensor:
    import torch

    torch.manual_seed(seed)
    init_inputs = reference.get_init_inputs()
    ref_model = reference.Model(*init_inputs).to(device).eval()
    torch.manual_seed(seed)
    new_model = solution.ModelNew(*init_inputs).to(device).eval()
    # Strict: a solution must keep the reference's parameter names and shapes so weights can be copied.
    new_model.load_state_dict(ref_model.state_dict(), strict=True)

    torch.manual_seed(seed)
    inputs = reference.get_inputs()
    for index, value in enumerate(inputs):
        if not isinstance(value, torch.Tensor):
            continue
        if value.device.type != "cpu":
            result.failures.append(f"seed {seed}: get_inputs()[{index}] is on {value.device}, not the CPU")
        if value.is_floating_point() and not (value.min() < 0 < value.max()):
            result.failures.append(f"seed {seed}: get_inputs()[{index}] does not take both signs")
    inputs = [v.to(device) if isinstance(v, torch.Tensor) else v for v in inputs]

    with torch.no_grad():
        expected = ref_model(*[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs])
        before = launches["count"]
        got = new_model(*[v.clone() if isinstance(v, torch.Tensor) else v for v in inputs])
    if launches["count"] == before:
        result.failures.append(f"seed {seed}: forward launched no Triton kernel")
    if not isinstance(got, torch.Tensor) or got.shape != expected.shape or got.dtype != expected.dtype:
        shape = getattr(got, "shape", type(got).__name__)
        result.failures.append(
            f"seed {seed}: output {shape}/{getattr(got, 'dtype', '')} != {expected.shape}/{expected.dtype}"
        )
        return expected.cpu()
    if not torch.isfinite(got).all():
        result.failures.append(f"seed {seed}: output has NaN or Inf")
    error = (got.float() - expected.float()).abs().max().item() if got.numel() else 0.0
    result.max_abs_error = max(result.max_abs_error, error)
    if not torch.allclose(got, expected, atol=ATOL, rtol=RTOL):
        result.failures.append(f"seed {seed}: outputs differ (max abs error {error:.3g})")
    return expected.cpu()


def _import_file(path: Path, source: str) -> ModuleType:
    # Triton's @jit reads the kernel's source file, so modules are imported from real files, never exec'd.
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _count_launches(module: ModuleType) -> dict:
    """Hook every Triton kernel the module defines, so a forward that launches none is caught."""
    from triton.runtime.jit import KernelInterface

    launches = {"count": 0}

    def hook(*args: object, **kwargs: object) -> None:
        launches["count"] += 1

    for value in vars(module).values():
        if isinstance(value, KernelInterface) and hasattr(value, "add_pre_run_hook"):
            value.add_pre_run_hook(hook)
    return launches


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kforge.problems.selfcheck", description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", help="cpu (Triton interpreter) or cuda")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--problems", nargs="*", default=[], help="LEVEL/ID keys or names; default: all built-in")
    args = parser.parse_args(argv)
    _prepare_triton(args.device)  # before anything below can import triton

    from kforge.problems.selection import select_problems
    from kforge.problems.sources import builtin_problems

    problems = select_problems(builtin_problems(), names=args.problems)
    results = check_solutions(problems, device=args.device, seeds=args.seeds)
    for item in results:
        print(json.dumps(asdict(item)), flush=True)
    return 0 if all(item.ok for item in results) else 1


if __name__ == "__main__":
    sys.exit(main())
