"""The candidate corpus through the real pool: sandbox, Triton interpreter, every status and defence.

One pool serves the whole module; after every candidate (crash, hang, escape attempt) the next
one must still be judged normally, which the ordering below exercises on purpose.

`make test` judges the whole corpus; `make test-fast` the first case of each status and layer mode, the first
attack on each item of the threat model, and the module's other checks (`fast_first` marks the rest slow).
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest
import torch

from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import EvalPool, Status, Verdict, sandbox
from kforge.problems.record import Problem
from locations import CANDIDATES, REPO


def _load_manifest():
    import importlib.util
    import sys

    path = CANDIDATES / "manifest.py"
    spec = importlib.util.spec_from_file_location("kforge_candidate_manifest", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses need the module registered
    spec.loader.exec_module(mod)
    return mod


_manifest = _load_manifest()
CASES, PROBLEMS, Case = _manifest.CASES, _manifest.PROBLEMS, _manifest.Case
ATTACKS, MODES = _manifest.ATTACKS, _manifest.MODES

SECRET = "hf_kforge_test_secret_4242"
CPU_CASES = [c for c in CASES if not c.gpu_only]


def fast_first(runs: list, key, ids: list[str], prefer=lambda run: 0) -> list:
    """`runs` as pytest parameters: of each `key(run)`, the first run (the first of those `prefer` ranks lowest)
    stays in the fast loop, every other one is marked slow (`make test` judges them all)."""
    fast = {}
    for i in sorted(range(len(runs)), key=lambda i: prefer(runs[i])):
        fast.setdefault(key(runs[i]), i)
    return [pytest.param(*(run if isinstance(run, tuple) else (run,)), id=name,
                         marks=() if i in fast.values() else (pytest.mark.slow,))
            for i, (run, name) in enumerate(zip(runs, ids))]


def make_problem(key: str) -> Problem:
    level, pid, name, code = PROBLEMS[key]
    return Problem(level, pid, name, code)


class _Pools:
    """One pool per layer mode (see manifest.MODES), started on first use and closed at the end."""

    def __init__(self, cache: Path) -> None:
        self.cache = cache
        self.pools: dict[str, EvalPool] = {}

    def __getitem__(self, mode: str) -> EvalPool:
        if mode not in self.pools:
            base = dict(num_correct_trials=3, run_timeout_s=8.0, compile_timeout_s=60.0, timing_timeout_s=10.0,
                        memory_limit_gb=4.0, cpu_workers=2)
            cfg = EvaluatorConfig(**(base | MODES[mode]))
            self.pools[mode] = EvalPool(cfg, devices=None, cache_dir=self.cache)
        return self.pools[mode]

    def close(self) -> None:
        for p in self.pools.values():
            p.close()


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory):
    old, old_path = os.environ.get("HF_TOKEN"), os.environ["PATH"]
    os.environ["HF_TOKEN"] = SECRET  # the pools are created with a secret in their environment
    os.environ["PATH"] = old_path + os.pathsep + "/kforge-trainer-path-marker"  # and a PATH of the trainer's
    ps = _Pools(tmp_path_factory.mktemp("kforge-cache"))
    try:
        yield ps
    finally:
        ps.close()
        os.environ["PATH"] = old_path
        if old is None:
            os.environ.pop("HF_TOKEN", None)
        else:
            os.environ["HF_TOKEN"] = old


@pytest.fixture(scope="module")
def pool(pools: _Pools) -> EvalPool:
    return pools["all"]


class _Listener:
    """A TCP server on the host that records whether anyone connected."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connected = False
        self.stop = False
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop:
            try:
                conn, _ = self.sock.accept()
                self.connected = True
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self.stop = True
        self.thread.join()
        self.sock.close()


def _sleepers(tag: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        try:
            if tag in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                found.append(int(pid))
        except OSError:
            pass
    return found


def _check(case: Case, v: Verdict) -> None:
    wanted = case.status.split("|")
    assert v.status.value in wanted, f"{case.file}: {v.status.value} not in {wanted}\n{v.feedback}\n{v.details}"
    for flag in case.flags:
        assert any(f.startswith(flag) for f in v.flags), f"{case.file}: flag {flag} missing from {v.flags}"
    assert v.correct is case.correct, f"{case.file}: correct={v.correct} flags={v.flags}"
    if v.flags:
        assert not v.correct
    assert v.feedback and SECRET not in v.feedback and SECRET not in v.error
    assert "/tmp/kforge-" not in v.feedback, v.feedback
    assert v.timing_meaningful is False and v.speedup is None


@pytest.mark.parametrize("case", fast_first(CPU_CASES, lambda c: (c.status, c.mode),
                                           [f"{c.file}-{c.backend}-{c.mode}" for c in CPU_CASES]))
def test_corpus_case(pools: _Pools, case: Case, tmp_path: Path) -> None:
    pool = pools[case.mode]
    code = case.code()
    listener = None
    tag = f"{time.time_ns() % 10**6 + 10**6}.{os.getpid()}"
    target = tmp_path / f"escape-{uuid.uuid4().hex}.txt"
    if "__PORT__" in code:
        listener = _Listener()
        code = code.replace("__PORT__", str(listener.port))
    code = code.replace("__SLEEP__", tag).replace("__TARGET__", str(target)).replace("__POOL_PID__", str(os.getpid()))
    try:
        v = pool.submit(make_problem(case.problem), code, case.backend).result(timeout=120)
    finally:
        if listener is not None:
            listener.close()
    _check(case, v)
    if listener is not None:
        assert not listener.connected, "the sandboxed child reached a TCP server on the host"
    if case.file == "write_outside.py":
        assert not target.exists()
        assert "Permission denied" in v.error or "Errno" in v.error, v.error
    if case.file == "detached_child.py":
        assert _sleepers(tag) == [], "a detached process outlived its candidate"
    if case.file == "env_secret.py":
        assert "no secret visible" in v.error, v.error
    if case.file == "read_other_memory.py":
        assert "LEAKED" not in v.error
    if case.file == "huge_alloc.py":
        assert "allocate" in v.error, v.error
    if case.file == "hang.py":
        assert "exceeded" in v.feedback
    if case.file == "segfault.py":
        assert "SIGSEGV" in v.feedback
    if case.status == "unsupported":
        assert "no GPU" in v.feedback
    # The pool still judges a good kernel right after every case.
    good = (CANDIDATES / "relu_correct.py").read_text()
    after = pool.submit(make_problem("relu"), good).result(timeout=60)
    assert after.correct, after.feedback


def test_an_honest_import_of_a_library_module_not_loaded_yet_is_judged_as_any_other(pool: EvalPool) -> None:
    """`from triton.language.extra import libdevice` (erf, tanh for a GELU) loads modules the child has not
    loaded: the loader's reads of their files were refused as the candidate's `open` (compile_error), and with
    every module frozen the import would have been refused for setting the new module's `__loader__`."""
    good = (CANDIDATES / "relu_correct.py").read_text().replace(
        "import triton.language as tl\n", "import triton.language as tl\nfrom triton.language.extra import libdevice\n")
    assert "libdevice" in good
    verdict = pool.submit(make_problem("relu"), good).result(timeout=120)
    assert verdict.correct and not verdict.flags, (verdict.status, verdict.flags, verdict.error)


def test_evaluate_many_keeps_order(pool: EvalPool) -> None:
    good = (CANDIDATES / "relu_correct.py").read_text()
    zeros = (CANDIDATES / "returns_zeros.py").read_text()
    items = [(make_problem("relu"), good, "triton"), (make_problem("relu"), zeros, "triton"),
             (make_problem("scale"), (CANDIDATES / "scale_correct.py").read_text(), "triton"),
             (make_problem("relu"), "", "triton"), (make_problem("relu"), good, "rocm")]
    out = pool.evaluate_many(items)
    assert [v.status for v in out] == [Status.CORRECT, Status.INCORRECT, Status.CORRECT, Status.FORMAT_ERROR,
                                       Status.UNSUPPORTED]
    assert out[1].trials_passed == 0 and out[1].trials == 4 and out[1].partial_credit == 0.0


def test_async_evaluate_and_verdict_roundtrip(pool: EvalPool) -> None:
    import asyncio

    good = (CANDIDATES / "relu_correct.py").read_text()
    v = asyncio.run(pool.evaluate(make_problem("relu"), good, "triton"))
    assert v.correct and v.trials == 4  # 3 trials + the signed-input trial (inputs are torch.rand)
    again = Verdict.from_dict(v.to_dict())
    assert again.status is Status.CORRECT and again.trials_passed == 4
    sandbox = v.details["sandbox"]
    assert sandbox["landlock"][0] and sandbox["seccomp"][0]


def test_partial_credit_when_only_some_trials_fail(pool: EvalPool) -> None:
    copy = (CANDIDATES / "copy_kernel.py").read_text()
    v = pool.submit(make_problem("relu"), copy).result(timeout=60)
    assert v.status is Status.INCORRECT and v.trials_passed == 3 and v.trials == 4
    assert 0.7 < v.partial_credit < 0.8 and v.max_abs_error and v.max_abs_error > 0.1
    assert "signed" in v.feedback


@pytest.mark.parametrize("case", [c for c in CASES if c.mode == "bare"], ids=lambda c: c.file)
def test_sandbox_cases_never_reach_the_child_with_every_layer_on(case: Case) -> None:
    from kforge.evaluator.static.static_check import check_source

    assert check_source(case.code(), PROBLEMS[case.problem][3], case.backend).errors


# Attacks on the parent-side guarantees (items 1 and 3 of the threat model) run with the in-process layers off in
# their own test below; here every other (attack, mode) pair.
PARENT_SIDE = [a for a in ATTACKS if a.item in (1, 3)]
_ATTACK_RUNS = [(a, mode) for a in ATTACKS for mode in a.expect if not (mode == "bare" and a in PARENT_SIDE)]


def _attack_code(attack, pools: _Pools) -> str:
    solution = REPO / "kforge/problems/builtin/level1/solutions/1_Add.py"
    return attack.code().replace("__CACHE__", str(pools.cache)).replace("__SOLUTION__", str(solution)).replace(
        "__CHECKOUT__", str(REPO))


@pytest.mark.parametrize("attack", fast_first(PARENT_SIDE, lambda a: a.item, [a.file for a in PARENT_SIDE]))
def test_parent_side_guarantees_hold_with_the_in_process_layers_off(pools: _Pools, attack) -> None:
    """Static checks and the audit hook off (`evaluator.static_checks=false`, `evaluator.audit_hook=false`):
    the candidate rewrites its harness at will, and still no attack on who reads the outputs (item 1) or on
    the timing (item 3) gets `correct` without a flag."""
    pool = pools["bare"]
    assert pool.cfg.static_checks is False and pool.cfg.audit_hook is False
    v = pool.submit(make_problem(attack.problem), _attack_code(attack, pools)).result(timeout=120)
    got = f"{v.status.value} {v.flags} {v.details.get('reason')} {v.error[-300:]}"
    assert not v.correct, f"{attack.file}: {got}"
    if "bare" in attack.expect:
        assert _manifest.matches(attack.expect["bare"], v), f"wanted {attack.expect['bare']}, got {got}"


# A thread the candidate started before the lock-down (confine.StrayThreads): the child is refused there.
STRAY_THREADS = {("thread_before_lockdown.py", "bare"), ("native_build_thread.py", "no_static"),
                 ("native_build_thread.py", "bare")}


@pytest.mark.parametrize("attack,mode", fast_first(_ATTACK_RUNS, lambda run: run[0].item,
                                                  [f"{a.file}-{m}" for a, m in _ATTACK_RUNS],
                                                  prefer=lambda run: run[1] != "all"))  # the pool started first
def test_attack(pools: _Pools, attack, mode: str) -> None:
    v = pools[mode].submit(make_problem(attack.problem), _attack_code(attack, pools)).result(timeout=120)
    got = f"{v.status.value} {v.flags} {v.details.get('reason')} {v.error[-300:]}"
    assert _manifest.matches(attack.expect[mode], v), f"wanted {attack.expect[mode]}, got {got}"
    assert SECRET not in v.error and SECRET not in v.feedback and "HF_TOKEN" not in v.error
    if attack.file == "read_cache.py" and mode == "bare":
        assert "Permission denied" in v.error, v.error
    if (attack.file, mode) in STRAY_THREADS:  # refused at the lock-down, and told so
        assert "lock-down" in v.details.get("reason", "") and "thread started before the lock-down" in v.error, got
    if attack.file == "stderr_symlink.py" and mode == "bare":  # the parent's environ must not show
        assert "died from" in v.feedback and "PATH=" not in v.error and "HOME=" not in v.error, v.error
    if attack.file == "host_text.py":  # nothing of the host reaches the text; the candidate's own lines do
        import pwd

        shown = v.error + v.feedback
        own = set(attack.code().split()) | set(_manifest.RELU.split())
        from kforge.evaluator.own_text import VOCABULARY

        common = own | {w.lower() for w in VOCABULARY}  # a user named like a word of an error message
        users = [u.pw_name for u in pwd.getpwall() if len(u.pw_name) > 3 and u.pw_name.lower() not in common]
        host = [str(REPO), "kforge-trainer-path-marker", os.uname().release,
                "/usr/local/bin", "PYTHONPATH", "HOME=", "TMPDIR="] + users
        assert not [h for h in host if h in shown], (host, shown)
        assert "candidate.py, line" in v.error and "raise RuntimeError(host())" in v.error, v.error
        assert "RuntimeError: " in v.error and len(v.error) <= 1200, v.error
    if attack.file == "host_text_forged.py":  # forged frames and compiler lines carry nothing of the host
        from kforge.evaluator.own_text import MAX_MESSAGE

        shown = v.error + v.feedback
        git = torch.version.git_version
        for host in (git[:7], str(int(git[:12], 16)), ".venv", "venv.", "/work/"):
            assert host not in shown, (host, shown)
        said = [line.split("error: ", 1)[1] for line in v.error.splitlines() if "error: " in line]
        assert said and sum(map(len, said)) <= MAX_MESSAGE, v.error  # the messages of one error together
    if attack.file == "root_files.py":  # never root; what it read would reach a prompt: nothing, and capped
        from kforge.evaluator.feedback import MAX_TEXT

        assert "SHADOW" not in v.error and "WRITABLE" not in v.error and "READ " not in v.error, v.error
        assert "uid=0 " not in v.error and "hosts: " in v.error, v.error  # the probes' results did reach the text
        assert "uid=" in v.error and len(v.error) <= MAX_TEXT, v.error
    # Whatever the attack did, the pool still judges an honest kernel right after it.
    good = (CANDIDATES / "relu_correct.py").read_text()
    assert pools[mode].submit(make_problem("relu"), good).result(timeout=60).correct


def test_the_decoy_trial_has_no_place_a_child_can_count(pools: _Pools, monkeypatch: pytest.MonkeyPatch) -> None:
    """decoy_count.py answers wrong on the second call with signed inputs only: that was always the decoy
    trial (last, after the signed trial), so it was `correct` with its kernel doing nothing. Now the decoy
    is one of the trial requests, anywhere but first; here the parent's two random choices are fixed so
    that the decoy comes before the signed trial: the decoy is answered right (kernel_not_needed) and the
    signed trial wrong."""
    import random

    from kforge.evaluator import examine

    assert {examine.decoy_place(4, random.Random(i)) for i in range(200)} == {1, 2, 3, 4}
    monkeypatch.setattr(examine, "trial_order", lambda ref, rng: list(range(len(ref.trials))))  # signed last
    monkeypatch.setattr(examine, "decoy_place", lambda n, rng: 1)
    code = (CANDIDATES / "attacks" / "decoy_count.py").read_text()
    v = pools["all"].submit(make_problem("relu"), code).result(timeout=120)
    assert v.status is Status.INCORRECT and "kernel_not_needed" in v.flags and not v.correct, (v.status, v.flags)


def test_every_sampled_read_has_positions_of_its_own(pools: _Pools) -> None:
    """Each timed call and each trial of a sampled output is read at positions drawn for it alone: a child
    that learnt where one read looked (a cache side channel on the shared memory) learns nothing about the
    next. (One set of positions once served every timed call.)"""
    pool = pools["sampled"]
    good = (CANDIDATES / "relu_correct.py").read_text()
    assert pool.submit(make_problem("relu"), good).result(timeout=60).correct
    ref = pool.references.get(pool._slots[0], make_problem("relu"))
    timed = [tuple(p[0].tolist()) for p in ref.positions]
    trials = [tuple(w[0].tolist()) for w in ref.trial_positions]
    assert len(timed) == len(ref.timing_seeds) >= 2 and len(set(timed)) == len(timed)
    assert len(trials) == len(ref.trials) + 1 and len(set(trials)) == len(trials)  # the decoy's last


@pytest.mark.slow  # every built-in problem's reference and solution through the pool: about 20 s
def test_every_builtin_solution_is_correct_through_the_pool(pool: EvalPool) -> None:
    """Honest kernels stay `correct` with every layer on: the arena reads, the per-call timing and the decoy
    trial (their own kernels skipped, their outputs must come out wrong) flag none of them."""
    from kforge.problems import builtin_problems

    problems = builtin_problems()
    verdicts = pool.evaluate_many([(p, p.solution, "triton") for p in problems])
    wrong = {p.key: (v.status.value, v.flags, v.details.get("reason")) for p, v in zip(problems, verdicts) if not v.correct}
    assert not wrong, wrong


BELOW_INTERPRETER = {"ctypes_launder.py": "the shell did not run", "collect_env_shell.py": "Operation not permitted",
                     "from_file_read.py": "Permission denied"}


@pytest.mark.parametrize("name", fast_first(sorted(BELOW_INTERPRETER), lambda name: "", sorted(BELOW_INTERPRETER)))
def test_library_laundering_is_refused_below_the_interpreter(pools: _Pools, name: str) -> None:
    """Both in-process layers off: what a library does for the candidate after READY (a shell, libc's system(),
    a file read with no audit event) is refused by the kernel (seccomp, Landlock), and the child says so."""
    attack = next(a for a in ATTACKS if a.file == name)
    v = pools["bare"].submit(make_problem(attack.problem), _attack_code(attack, pools)).result(timeout=120)
    # Refused in its first call, before any call was answered: nothing is known to have compiled.
    assert v.status is Status.COMPILE_ERROR, f"{v.status.value} {v.flags} {v.error[-300:]}"
    assert BELOW_INTERPRETER[name] in v.error, v.error
    lockdown = v.details["sandbox"]["lockdown"]
    assert lockdown["seccomp"][0] and lockdown["landlock"][0] and lockdown["killed_leftovers"], lockdown


def test_one_evaluation_cannot_hand_its_answers_to_a_later_one(pools: _Pools) -> None:
    """replay_publish.py (honest) publishes the pairs it saw through System V shared memory; replay.py,
    evaluated after it on the same problem, answers from them and computes nothing. It was `correct` with
    no flag: every child shared the host's IPC namespace, and trial and timing inputs were the same for
    every evaluation. With the in-process layers off (ctypes is theirs to refuse) it must not be correct."""
    pool = pools["bare"]
    by_file = {a.file: a for a in ATTACKS}
    _manifest.remove_replay_table()
    try:
        first = pool.submit(make_problem("relu"), by_file["replay_publish.py"].code()).result(timeout=120)
        assert first.correct, (first.status, first.flags, first.error)
        again = pool.submit(make_problem("relu"), by_file["replay.py"].code()).result(timeout=120)
        assert not again.correct, "a candidate that computes nothing replayed an earlier evaluation's outputs"
        assert _manifest.matches(by_file["replay.py"].expect["bare"], again), (again.status, again.flags)
        # Each defence on its own: the segment died with the publisher's IPC namespace (the host has none),
        assert again.details["sandbox"]["namespaces"] & sandbox.CLONE_NEWIPC
        assert _manifest.replay_table_id() < 0, "a child's System V segment outlived it"
    finally:
        _manifest.remove_replay_table()


def test_every_evaluation_gets_inputs_of_its_own(pools: _Pools) -> None:
    """and the parent draws trial, decoy and timing inputs per evaluation (`evaluator.inputs_reuse` 1), so
    a table of earlier pairs is of no use. What does not depend on the inputs' values is measured once:
    the weights, the layout and the loop's clock are the same for every draw."""
    pool = pools["all"]
    slot, relu = pool._slots[0], make_problem("relu")
    first, second = pool.references.get(slot, relu), pool.references.get(slot, relu)
    seeds = [{s for s, _ in r.trials} | set(r.timing_seeds) | {r.decoy[0]} for r in (first, second)]
    assert len(seeds[0]) == len(first.trials) + len(first.timing_seeds) + 1 and not seeds[0] & seeds[1]
    assert not torch.equal(first.outputs[0][0], second.outputs[0][0])
    assert first.clock is second.clock and first.init_seed == second.init_seed
    good = (CANDIDATES / "relu_correct.py").read_text()
    assert pool.submit(relu, good).result(timeout=60).correct  # judged against a draw of its own
    shared = EvalPool(EvaluatorConfig(**(pool.cfg.model_dump() | {"inputs_reuse": 2})), devices=None,
                      cache_dir=pools.cache)
    try:
        a, b, c = (shared.references.get(shared._slots[0], relu) for _ in range(3))
        assert a.timing_seeds == b.timing_seeds and not set(b.timing_seeds) & set(c.timing_seeds)
    finally:
        shared.close()


@pytest.mark.slow  # a pool of its own
def test_a_draw_checks_a_secret_subset_of_the_timed_calls(pools: _Pools) -> None:
    """A draw runs the reference on DRAW_CHECKED_CALLS of its timed calls' inputs, picked at random (with all
    of them a draw cost as much as the candidate's timing); every timed call still gets fresh inputs. The timed
    reference run, which computes every call's values anyway, keeps them all."""
    from kforge.evaluator.reference import DRAW_CHECKED_CALLS

    calls = DRAW_CHECKED_CALLS + 6
    pool = EvalPool(EvaluatorConfig(**(pools["all"].cfg.model_dump() | {"cpu_timing_calls": calls})), devices=None,
                    cache_dir=pools.cache)
    try:
        slot, relu = pool._slots[0], make_problem("relu")
        timed, drawn, again = (pool.references.get(slot, relu) for _ in range(3))
        assert len(timed.samples) == calls and all(x is not None for x in timed.samples)
        for draw in (drawn, again):
            assert len(draw.timing_seeds) == len(draw.samples) == calls
            assert sum(x is not None for x in draw.samples) == DRAW_CHECKED_CALLS
        assert [x is None for x in drawn.samples] != [x is None for x in again.samples]  # 1 in C(22, 16) alike
        assert not set(drawn.timing_seeds) & set(again.timing_seeds)
        good = (CANDIDATES / "relu_correct.py").read_text()
        assert pool.submit(relu, good).result(timeout=120).correct  # judged against a draw's checked calls
        # A candidate wrong in every timed call cannot miss all the checked ones.
        wrong = good.replace("class ModelNew(nn.Module):", "_n = [0]\n\n\nclass ModelNew(nn.Module):").replace(
            "        return relu(x)", "        _n[0] += 1\n        y = relu(x)\n        return y.add_(1.0) if _n[0] > 6 else y")
        v = pool.submit(relu, wrong).result(timeout=120)
        assert v.status is Status.CORRECT and "timed_output_mismatch" in v.flags, (v.status, v.flags, v.details)
    finally:
        pool.close()


def test_a_draw_of_inputs_that_fails_is_the_references_fault(pools: _Pools, monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's run on an evaluation's new inputs goes on while the candidate's child starts; when
    it fails, the verdict says the reference failed (no candidate is blamed, none is passed)."""
    pool = pools["all"]

    def broken(*args, **kwargs):
        raise RuntimeError("the reference ran out of budget")

    monkeypatch.setattr(pool.references, "draw", broken)
    good = (CANDIDATES / "relu_correct.py").read_text()
    v = pool.submit(make_problem("relu"), good).result(timeout=60)
    assert v.status is Status.RUNTIME_ERROR and v.details.get("reference_error") and not v.correct, v.details
    assert "reference failed" in v.error and "not the candidate's fault" in v.feedback
    assert v.details["draw_attempts"] == 3  # a reference that fails on every draw: given up after three


@pytest.mark.slow  # judged through the pool
def test_a_draw_that_fails_once_is_drawn_again(pools: _Pools, monkeypatch: pytest.MonkeyPatch) -> None:
    """An H100 beside a busy pool: two honest KernelBench kernels (52, 96) came back "the problem's reference
    Model failed" in one of three rounds, though the same reference had run there (its clock cached). A draw
    that fails once is the machine's moment, not the problem's: the evaluation draws again."""
    pool = pools["all"]
    real, calls = pool.references.draw, []

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("the reference timed out")
        return real(*args, **kwargs)

    monkeypatch.setattr(pool.references, "draw", once)
    good = (CANDIDATES / "relu_correct.py").read_text()
    v = pool.submit(make_problem("relu"), good).result(timeout=120)
    assert v.status is Status.CORRECT and not v.details.get("reference_error") and len(calls) == 2, v.details
