"""Evaluator pieces on their own: static checks, comparison, feedback cleaning, wire safety, CLI."""

from __future__ import annotations

import json
import mmap
import os
import pickle
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from kforge.cli.app import app
from kforge.config.schema import EvaluatorConfig
from kforge.evaluator import confine, layers, sandbox
from kforge.evaluator.compare import compare_outputs, identical, tolerance
from kforge.evaluator.feedback import clean_error, write_feedback
from kforge.evaluator.static.static_check import check_source, reference_ops
from kforge.evaluator.verdict import Status, Verdict
from kforge.evaluator.wire import WireError, decode, encode
from locations import CANDIDATES

MATMUL_PROBLEM = '''import torch
import torch.nn as nn
class Model(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
    def forward(self, a, b):
        return torch.matmul(a, b) + self.fc(a).view(a.shape)
def get_inputs():
    return [torch.rand(4, 4), torch.rand(4, 4)]
def get_init_inputs():
    return [4]
'''

KERNEL = '''
import torch, triton, triton.language as tl
import torch.nn as nn
@triton.jit
def k(x_ptr):
    x = tl.load(x_ptr)
    tl.store(x_ptr, x)
'''


def test_reference_ops_include_calls_layers_and_matmul_operator() -> None:
    ops = reference_ops(MATMUL_PROBLEM)
    assert {"matmul", "Linear", "linear"} <= ops
    assert "view" not in ops and "super" not in ops


@pytest.mark.parametrize("body, flag", [
    ("return torch.matmul(a, b)", "pytorch_op:matmul"),
    ("return a @ b", "pytorch_op:matmul"),
    ("return self.fc(a)", "pytorch_op:Linear"),
    ("return torch.nn.functional.linear(a, self.fc.weight)", "pytorch_op:linear"),
    ("try:\n            return k[(1,)](a)\n        except Exception:\n            return a.mm(b)", "try_except_fallback"),
])
def test_static_flags_on_forward(body: str, flag: str) -> None:
    code = KERNEL + f'''
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
    def forward(self, a, b):
        {body}
'''
    rep = check_source(code, MATMUL_PROBLEM, "triton")
    assert not rep.errors
    assert flag in rep.flags, rep.flags


def test_glue_ops_and_layers_in_init_are_not_flagged() -> None:
    code = KERNEL + '''
class ModelNew(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.fc = nn.Linear(n, n)
    def forward(self, a, b):
        out = torch.empty_like(a).view(-1).contiguous()
        k[(triton.cdiv(a.numel(), 4),)](out)
        return out.reshape(a.shape)
'''
    rep = check_source(code, MATMUL_PROBLEM, "triton")
    assert rep.errors == [] and rep.flags == [] and rep.kernels == ["k"]


def test_static_errors_and_patch_flags() -> None:
    assert "ModelNew" in check_source(KERNEL, MATMUL_PROBLEM, "triton").errors[0]
    no_kernel = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    pass\n"
    assert "triton.jit" in check_source(no_kernel, MATMUL_PROBLEM, "triton").errors[0]
    assert "load_inline" in check_source(no_kernel, MATMUL_PROBLEM, "cuda").errors[0]
    patched = KERNEL + "torch.cuda.synchronize = None\nclass ModelNew(nn.Module):\n    pass\n"
    errors = check_source(patched, MATMUL_PROBLEM, "triton").errors
    assert any("patching a library" in e for e in errors), errors
    assert check_source("def f(:\n", MATMUL_PROBLEM, "triton").errors[0].startswith("SyntaxError")


def test_compare_tolerances_and_failures() -> None:
    cfg = EvaluatorConfig()
    ref = torch.linspace(-1, 1, 100)
    assert compare_outputs([ref + 5e-5], [ref], cfg).passed
    assert not compare_outputs([ref + 1e-2], [ref], cfg).passed
    half = ref.half()
    assert compare_outputs([half + 0.005], [half], cfg).passed  # fp16 gets 1e-2
    assert tolerance(torch.int64, cfg) == (0.0, 0.0)
    bad = ref.clone()
    bad[3] = float("nan")
    res = compare_outputs([bad], [ref], cfg)
    assert not res.passed and "NaN" in res.reason
    assert "shape" in compare_outputs([ref.view(10, 10)], [ref], cfg).reason
    assert "dtype" in compare_outputs([ref.double()], [ref], cfg).reason
    assert "outputs" in compare_outputs([ref, ref], [ref], cfg).reason
    ints = torch.arange(5)
    assert not compare_outputs([ints + 1], [ints], cfg).passed
    assert identical([ints], [ints.clone()]) and not identical([ints], [ints + 1])


def test_complex_outputs_are_compared_on_both_parts_with_their_dtype_tolerance() -> None:
    """double() of a complex tensor drops its imaginary part (a kernel leaving every imaginary part 0 was
    correct), and complex dtypes fell to atol = rtol = 0 (an honest 1-ulp difference was incorrect)."""
    cfg = EvaluatorConfig()
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.complex64, torch.complex128):
        want = torch.randn(64, 32, dtype=dtype, generator=gen)
        real_only = torch.complex(want.real, torch.zeros_like(want.imag))
        res = compare_outputs([real_only], [want], cfg)
        assert not res.passed and res.max_abs > 0.1, (dtype, res)
        part = want.real.dtype
        one_ulp = torch.complex(torch.nextafter(want.real, torch.full_like(want.real, torch.finfo(part).max)),
                                torch.nextafter(want.imag, torch.full_like(want.imag, -torch.finfo(part).max)))
        assert not torch.equal(one_ulp, want)
        assert compare_outputs([one_ulp], [want], cfg).passed, dtype
        assert not compare_outputs([want.conj().resolve_conj()], [want], cfg).passed
    assert tolerance(torch.complex64, cfg) == tolerance(torch.float32, cfg)
    assert tolerance(torch.complex128, cfg) == tolerance(torch.float64, cfg)


def test_clean_error_hides_paths_harness_frames_and_secrets() -> None:
    scratch = "/tmp/kforge-abc123"
    text = (
        "Traceback (most recent call last):\n"
        '  File "/work/main/kforge/evaluator/child/harness.py", line 10, in run\n'
        "    cand = _load_module(x)\n"
        "           ^^^^^^^^^^^^^^\n"
        f'  File "{scratch}/candidate.py", line 5, in forward\n'
        "    raise ValueError(token)\n"
        "ValueError: hf_supersecret in /tmp/kforge-abc123/data\n"
    )
    out = clean_error(text, scratch, ["hf_supersecret"])
    assert "kforge/evaluator" not in out and "^^^" not in out and "/tmp/kforge" not in out
    assert "hf_supersecret" not in out and "***" in out
    assert 'File "candidate.py", line 5, in forward' in out


def test_error_text_for_a_prompt_is_built_from_the_candidates_own() -> None:
    """Only the candidate's frames (with the parent's copy of each source line), the exception type and a
    bounded message of words the candidate's source, the problem or kforge's vocabulary hold: nothing of
    what the child read of the host, however it is written."""
    from kforge.evaluator.own_text import MAX_MESSAGE, candidate_error

    code = "import torch\n\ndef forward(x):\n    raise RuntimeError('bad shape ' + str(x.shape[0]))\n"
    problem = "def get_inputs():\n    return [torch.rand(48, 40)]\n"
    text = ("Traceback (most recent call last):\n"
            '  File "/work/checkout/kforge/evaluator/child/loop.py", line 215, in serve\n'
            "    msg = handlers[op](req)\n"
            '  File "/tmp/kforge-pool-1/kforge-x/candidate.py", line 4, in forward\n'
            "    PYTHONPATH=/work/checkout HOME=/home/alice\n"  # the child's claim of the source line
            "RuntimeError: bad shape 48 PYTHONPATH=/work/checkout PATH=/home/alice/.local/bin "
            "users root daemon alice release 6.8.0-1017-aws cpus 96 " + "x" * 2000 + "\n")
    out = candidate_error(text, code, problem)
    assert out.splitlines()[:2] == ["candidate.py, line 4, in forward",
                                    "    raise RuntimeError('bad shape ' + str(x.shape[0]))"], out
    assert out.splitlines()[2].startswith("RuntimeError: bad shape 48 ")
    for host in ("checkout", "alice", "PYTHONPATH", "daemon", "1017", "aws", "96", "loop.py", "handlers", "HOME"):
        assert host not in out, (host, out)
    assert len(out.splitlines()[2]) <= len("RuntimeError: ") + MAX_MESSAGE
    # A frame that is not the candidate's, an exception type nobody knows: nothing of them.
    odd = 'File "/etc/passwd", line 1, in root\nLeakError0x: alice\nKeyError: alice'
    assert candidate_error(odd, code, problem) == "KeyError: …"


def test_clean_error_hides_a_harness_frame_whose_head_was_cut_off() -> None:
    # The child sends only the end of a long traceback: its first line can be a frame's tail.
    text = ('i22/kforge/evaluator/child/loop.py", line 215, in serve\n    msg = handlers[op](req)\n'
            '  File "/tmp/kforge-x/candidate.py", line 4, in forward\n    raise RuntimeError("no")\nRuntimeError: no\n')
    out = clean_error(text, "/tmp/kforge-x", [])
    assert "loop.py" not in out and "handlers" not in out and "kforge" not in out
    assert out.endswith("RuntimeError: no") and 'File "candidate.py", line 4' in out


def test_feedback_mentions_trials_flags_and_speed() -> None:
    v = Verdict(Status.INCORRECT, trials_passed=2, trials=5, max_abs_error=0.5, flags=["pytorch_op:relu"])
    text = write_feedback(v)
    assert "2/5" in text and "0.5" in text and "relu" in text


def test_child_messages_carry_no_pickle(tmp_path: Path) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {tmp_path}/pwned",))

    with pytest.raises(WireError):
        decode(pickle.dumps(Evil()))
    assert not (tmp_path / "pwned").exists()
    msg = decode(encode({"type": "trial", "x": [torch.ones(2), torch.tensor(3, dtype=torch.bfloat16), 1.5, None]}))
    assert msg["x"][0].sum() == 2 and msg["x"][1].dtype == torch.bfloat16 and msg["x"][2:] == [1.5, None]
    # An object that is not plain data travels as text, never as an object.
    assert isinstance(decode(encode({"type": "t", "o": Evil()}))["o"], str)


def test_explain_matches_what_the_kernel_allows() -> None:
    rows = {name: (active, detail) for name, active, detail in layers.explain()}
    caps = layers.capabilities()
    assert rows["Landlock filesystem (writes only to scratch)"][0] == (confine.landlock_abi() >= 1)
    assert rows["network namespace (no network)"][0] == caps.netns
    assert rows["seccomp (no AF_INET/AF_INET6 sockets, no ptrace)"][0] == caps.seccomp
    assert rows["[kernel] UTS namespace (hostname is its own)"][0] == caps.utsns
    assert rows["[kernel] IPC namespace (System V and POSIX IPC die with the child)"][0] == caps.ipcns
    assert rows["[kernel] never root"][0] == (sandbox.child_ids()[0] != 0)
    after = rows["[kernel] after set-up: no exec, new process or System V IPC; fewer reads"]
    assert after[0] == (caps.seccomp and confine.landlock_abi() >= 1)
    assert all(isinstance(d, str) and d for _a, d in rows.values())


def test_clean_env_drops_secrets() -> None:
    trainer = "/home/someone/bin:/work/checkout/.venv/bin:" + os.environ.get("PATH", "/usr/bin")
    env = sandbox.clean_env({"PATH": trainer, "HF_TOKEN": "x" * 10, "OPENAI_API_KEY": "y" * 10, "LANG": "C",
                             "PYTHONPATH": "/work/checkout"})
    assert set(env) == {"PATH", "LANG"} and env["LANG"] == "C"
    # Not the trainer's PATH: the Python installation's folder, the build tools' folders, the system's.
    assert "/home/someone/bin" not in env["PATH"] and "/work/checkout" not in env["PATH"]
    assert env["PATH"].split(os.pathsep)[0] == os.path.dirname(sys.executable)
    assert env["PATH"].endswith("/usr/local/bin:/usr/bin:/bin")
    assert sandbox.secret_values({"HF_TOKEN": "abcdefgh", "HOME": "/root"}) == ["abcdefgh"]


runner = CliRunner()


def test_check_cli_bad_arguments_exit_2(tmp_path: Path) -> None:
    res = runner.invoke(app, ["check", str(tmp_path / "missing.py"), "--problem", "1/1"])
    assert res.exit_code == 2
    cand = CANDIDATES / "relu_correct.py"
    res = runner.invoke(app, ["check", str(cand), "--problem", "99/99"])
    assert res.exit_code == 2
    res = runner.invoke(app, ["check", str(cand)])
    assert res.exit_code == 2


def test_check_cli_json_and_explain(tmp_path: Path) -> None:
    problem = tmp_path / "relu_problem.py"
    problem.write_text("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
                       "        return torch.relu(x)\ndef get_inputs():\n    return [torch.randn(8, 8)]\n"
                       "def get_init_inputs():\n    return []\n")
    res = runner.invoke(app, ["check", str(CANDIDATES / "copy_kernel.py"), "--problem", str(problem), "--json",
                              "--trials", "2"])
    assert res.exit_code == 1, res.output  # a verdict that is not correct: exit 1, the verdict printed
    data = json.loads(res.stdout)
    assert data["status"] == "incorrect" and data["correct"] is False and data["trials"] == 2
    for key in ("flags", "trials_passed", "speedup", "feedback", "timings"):
        assert key in data
    res = runner.invoke(app, ["check", "--explain-sandbox"])
    assert res.exit_code == 0 and "Landlock" in res.stdout


def test_signed_trial_scales_atol_by_output_magnitude_but_still_rejects_zeros():
    import torch

    from kforge.config.schema import EvaluatorConfig
    from kforge.evaluator.compare import compare_outputs

    cfg = EvaluatorConfig()
    torch.manual_seed(0)
    want = torch.randn(64, 4096).sum(dim=1, keepdim=True)  # magnitudes ~64, some near zero
    rounding = want + 5e-4 * torch.randn_like(want)  # what a different summation order can give
    assert not compare_outputs([rounding], [want], cfg).passed
    assert compare_outputs([rounding], [want], cfg, scale_atol=True).passed
    assert not compare_outputs([torch.zeros_like(want)], [want], cfg, scale_atol=True).passed
    assert not compare_outputs([want.abs()], [want], cfg, scale_atol=True).passed


SEEN_DEVICES_PROBLEM = '''
import torch
SEEN = []
def get_inputs():
    x = torch.rand(8)
    SEEN.append(str(x.device))
    return [x]
'''


@pytest.mark.slow  # a Python process of its own
def test_inputs_stay_on_the_device_after_a_signed_trial_came_first(tmp_path: Path) -> None:
    """torch's device context caches the factories it redirects on first use; a signed trial first in a
    fresh process (where `torch.rand` is swapped) must not send every later `torch.rand` to the CPU."""
    (tmp_path / "seen_problem.py").write_text(SEEN_DEVICES_PROBLEM)
    script = (
        "import seen_problem as p\n"
        "from kforge.evaluator.child.loop import make_inputs\n"
        "make_inputs(p, 1, True, 'meta'); make_inputs(p, 2, False, 'meta'); make_inputs(p, 3, True, 'meta')\n"
        "print(','.join(p.SEEN))\n"
    )
    import subprocess

    # The child imports the problem from tmp_path through PYTHONPATH (after the working folder: kforge's checkout).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "meta,meta,meta", out.stdout


# --- the output arena and the freeze: the parent reads what the child committed -----------------

def test_arena_layout_read_whole_or_at_positions_and_sealed() -> None:
    from kforge.evaluator.arena import Arena, layout
    from kforge.evaluator.child.arena_writer import ArenaWriter
    from kforge.evaluator.protocol import ALL

    meta = [[[3, 5], "torch.float32"], None, [[4], "torch.int64"]]
    slots, size = layout(meta)
    assert slots == [[0, 60], None, [4096, 32]] and size == 8192
    arena = Arena(size, sealed=True)
    writer = ArenaWriter(os.dup(arena.fd), on_gpu=False)  # the child's copy of the descriptor
    try:
        x, i = torch.randn(3, 5), torch.arange(4)
        writer.put([x.t().contiguous().t(), 7, i], slots, size)  # strided outputs are copied whole too
        got = arena.read(meta, slots, ALL, [None, 7, None])
        assert torch.equal(got[0], x) and got[1] == 7 and torch.equal(got[2], i)
        got = arena.read(meta, slots, [torch.tensor([14, 0]), None, torch.tensor([3])], [None, 7, None])
        assert got[0].tolist() == [x.reshape(-1)[14].item(), x.reshape(-1)[0].item()] and got[2].tolist() == [3]
        # An output of the wrong size is not written (its slot keeps what was there).
        writer.put([torch.zeros(2), 7, torch.zeros(4, dtype=torch.int64)], slots, size)
        assert torch.equal(arena.read(meta, slots, ALL, [None, 7, None])[0], x)
        # Sealed: whoever holds the descriptor can neither shrink it under the parent's mapping nor grow it.
        for bad in (0, 2 * size):
            with pytest.raises(OSError):
                os.ftruncate(writer.fd, bad)
    finally:
        writer._unmap()
        os.close(writer.fd)
        arena.close()


def _spinner() -> tuple[int, mmap.mmap]:
    """A forked process in a process group of its own that counts as fast as it can in shared memory."""
    import struct

    counter = mmap.mmap(-1, 8)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the spinning child
        os.setsid()
        n = 0
        while True:
            n += 1
            counter[:8] = struct.pack("<Q", n)
    return pid, counter


def _count(counter: mmap.mmap) -> int:
    import struct
    import time

    time.sleep(0.05)
    return struct.unpack("<Q", counter[:8])[0]


@pytest.mark.parametrize("with_cgroup", [False, True], ids=["sigstop", "cgroup"])
def test_frozen_stops_every_thread_and_resumes(with_cgroup: bool) -> None:
    import signal

    from kforge.evaluator.children import CgroupFactory
    from kforge.evaluator.freeze import frozen

    factory = CgroupFactory() if with_cgroup else None
    cgroup = factory.new() if factory is not None else None
    if with_cgroup and cgroup is None:
        pytest.skip("no writable cgroup v2 here")
    pid, counter = _spinner()
    try:
        if cgroup is not None:
            (cgroup / "cgroup.procs").write_text(str(pid))
        assert _count(counter) < _count(counter)  # running
        with frozen(pid, cgroup):
            a = _count(counter)
            assert _count(counter) == a  # stopped while the parent reads
        assert _count(counter) > a  # resumed
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        if factory is not None:
            CgroupFactory.kill_and_remove(cgroup)
            factory.close()


# --- the sandbox itself: never root, host-global settings read-only ------------------------------

PROBE_PROBLEM = '''
import os
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return []


def get_init_inputs():
    got = [f"uid={os.getuid()}"]
    for path, mode in (("/etc/shadow", os.O_RDONLY), ("/proc/sys/kernel/hostname", os.O_WRONLY),
                       ("/sys/kernel/mm/transparent_hugepage/enabled", os.O_WRONLY),
                       (f"/proc/self/task/{os.getpid()}/comm", os.O_WRONLY)):
        try:
            os.close(os.open(path, mode))  # opened, never written
            got.append(f"open {path}")
        except OSError as exc:
            got.append(f"refused {path}")
    raise RuntimeError(" | ".join(got))
'''


def test_the_child_is_unprivileged_and_host_settings_stay_read_only(tmp_path: Path) -> None:
    """Landlock off and /proc writable, as on a GPU: the uid and the read-only mounts hold on their own."""
    import time

    from kforge.evaluator.children import CgroupFactory, Child, Zygote

    zygote = Zygote("probe", sandbox.clean_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""), tmp_path / "z.log")
    cgroups = CgroupFactory()
    request = {"env": zygote.env, "writable": ["/proc"], "readable": [], "memory_bytes": 4 << 30,
               "landlock": False, "restrict_reads": False}
    child = Child(zygote, cgroups, "reference", request, {"problem_code": PROBE_PROBLEM, "init_seed": 1,
                                                          "device": "cpu"}, str(tmp_path))
    try:
        deadline = time.monotonic() + 120
        applied = child.ask(None, "sandbox", deadline)["applied"]
        text = str(child.ask(None, "ready", deadline).get("message"))
    finally:
        child.close()
        zygote.close()
        cgroups.close()
    if os.geteuid() == 0:
        assert "uid=65534" in text and applied["uid"] != 0, text
        assert "refused /etc/shadow" in text, text
    assert set(applied.get("read_only", [])) == {"/proc/sys", "/sys"}, applied
    assert "refused /proc/sys/kernel/hostname" in text and "refused /sys/kernel/mm" in text, text
    assert "open /proc/self/task/1/comm" in text, text  # what CUDA writes at init


READ_ONLY_PROBE = """import os
import torch


class Model(torch.nn.Module):
    def forward(self, x):
        return x


def get_inputs():
    return [torch.rand(2)]


def get_init_inputs():
    results = [open(os.path.join(FOLDER, "built.so")).read()]
    for what, path in (("write", os.path.join(FOLDER, "pairs.bin")), ("append", os.path.join(FOLDER, "built.so"))):
        try:
            with open(path, "a") as fh:
                fh.write("replay table")
            results.append(what + " allowed")
        except OSError as exc:
            results.append(what + " refused " + type(exc).__name__)
    raise RuntimeError(" | ".join(results))
"""


@pytest.mark.parametrize("landlock", [pytest.param(False, marks=pytest.mark.slow), True])  # a child each
def test_a_folder_given_to_read_is_read_only_to_the_child(tmp_path: Path, landlock: bool) -> None:
    """A CUDA candidate's build folder, once built, is given to every child judged after it to read
    only (it was writable: one evaluation could leave (input, output) pairs there for a later one). It
    holds at the mount level with Landlock off, and under Landlock with reads restricted it is readable."""
    import time

    from kforge.evaluator.children import CgroupFactory, Child, Zygote

    folder = tmp_path / "build"
    folder.mkdir()
    (folder / "built.so").write_text("BUILT")
    os.chmod(folder, 0o777)  # whoever the child runs as, only the sandbox may refuse the write
    os.chmod(folder / "built.so", 0o666)
    zygote = Zygote("probe", sandbox.clean_env(TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES=""), tmp_path / "z.log")
    cgroups = CgroupFactory()
    request = {"env": zygote.env, "writable": [], "readable": [str(folder)], "memory_bytes": 4 << 30,
               "landlock": landlock, "restrict_reads": True}
    code = READ_ONLY_PROBE.replace("FOLDER", repr(str(folder)))
    child = Child(zygote, cgroups, "reference", request, {"problem_code": code, "init_seed": 1, "device": "cpu"},
                  str(tmp_path))
    try:
        deadline = time.monotonic() + 120
        child.ask(None, "sandbox", deadline)
        text = str(child.ask(None, "ready", deadline).get("message"))
    finally:
        child.close()
        zygote.close()
        cgroups.close()
    assert "BUILT | write refused" in text and "append refused" in text, text
    assert not (folder / "pairs.bin").exists() and (folder / "built.so").read_text() == "BUILT"


def test_child_text_reaching_a_prompt_is_capped() -> None:
    from kforge.evaluator.feedback import MAX_LINE, MAX_TEXT

    secretish = "root:$6$" + "a" * 5000
    text = "Traceback (most recent call last):\n" + "\n".join(f"RuntimeError: {secretish}" for _ in range(20))
    out = clean_error(text, None, [])
    assert len(out) <= MAX_TEXT and all(len(line) <= MAX_LINE for line in out.splitlines())


class _Runtime:
    """Stands in for the CUDA runtime this machine lacks: records registrations, refuses when told."""

    def __init__(self, refuse: bool) -> None:
        self.refuse, self.calls = refuse, []

    def cudaHostRegister(self, ptr: int, size: int, flags: int) -> int:
        self.calls.append(("register", ptr, size))
        return 1 if self.refuse else 0

    def cudaHostUnregister(self, ptr: int) -> int:
        self.calls.append(("unregister", ptr))
        return 0

    def cudaGetLastError(self) -> int:
        self.calls.append(("clear",))
        return 0


@pytest.mark.parametrize("refuse", [False, True])
def test_arena_writer_gpu_path_pins_once_and_clears_a_refusal(monkeypatch: pytest.MonkeyPatch, refuse: bool) -> None:
    """The GPU branch of the writer on a CPU: the arena registered once per mapping (unregistered before it
    is remapped), a refused registration cleared, and the copy done either way."""
    from kforge.evaluator.arena import Arena, layout
    from kforge.evaluator.child import arena_writer
    from kforge.evaluator.protocol import ALL

    runtime = _Runtime(refuse)
    monkeypatch.setattr(arena_writer, "cuda_runtime", lambda: runtime)
    monkeypatch.setattr(arena_writer, "_synchronize", lambda: None)  # bound at import, as the child's copy uses it
    meta = [[[8], "torch.float32"]]
    slots, size = layout(meta)
    arena = Arena(2 * size)
    writer = arena_writer.ArenaWriter(os.dup(arena.fd), on_gpu=True)
    try:
        x = torch.randn(8)
        writer.put([x], slots, size)
        writer.put([x + 1], slots, size)  # same mapping: no second registration
        assert torch.equal(arena.read(meta, slots, ALL)[0], x + 1)
        registered = [c for c in runtime.calls if c[0] == "register"]
        assert len(registered) == 1 and registered[0][2] == size
        assert (("clear",) in runtime.calls) is refuse and (writer.pinned is None) is refuse
        writer.put([x], slots, 2 * size)  # a bigger arena: remapped, the old mapping unregistered first
        assert [c[0] for c in runtime.calls].count("unregister") == (0 if refuse else 1)
    finally:
        writer._unmap()
        os.close(writer.fd)
        arena.close()


SOFTMAX_PROBLEM = '''import torch
import torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=1)
def get_inputs():
    return [torch.randn(4, 4)]
def get_init_inputs():
    return []
'''


@pytest.mark.parametrize("init, body", [
    ("", "return nn.Softmax(dim=-1)(y)"),
    ("", "return torch.nn.Softmax(1).forward(y)"),
    ("self.sm = nn.Softmax(dim=-1)", "return self.sm(y)"),
    ("", "return y.softmax(-1)"),
    ("", "return torch.special.softmax(y, -1)"),
])
def test_the_reference_op_is_flagged_under_every_spelling(init: str, body: str) -> None:
    code = KERNEL + f'''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        {init or "pass"}
    def forward(self, y):
        k[(1,)](y)
        {body}
'''
    rep = check_source(code, SOFTMAX_PROBLEM, "triton")
    assert not rep.errors, rep.errors
    assert any(f.lower() == "pytorch_op:softmax" for f in rep.flags), rep.flags


def test_op_keys_join_modules_functions_methods_and_aliases() -> None:
    from kforge.evaluator.static.op_names import op_key

    assert op_key("nn.Softmax") == op_key("softmax") == op_key("Tensor.softmax_")
    assert op_key("BatchNorm2d") == op_key("F.batch_norm") and op_key("MSELoss") == op_key("mse_loss")
    assert op_key("torch.clip") == op_key("clamp") and op_key("bmm") == op_key("matmul")
    assert op_key("LogSoftmax") == op_key("log_softmax") != op_key("softmax")
    assert op_key("ReLU") == op_key("relu") != op_key("LeakyReLU")


def test_outputs_no_kernel_of_the_candidates_wrote_are_flagged() -> None:
    from kforge.evaluator.child.guard import Launch, summarize
    from kforge.evaluator.judge import flags_from_evidence

    copy = Launch(True, "copy_kernel", [(0, 100), (100, 200)])  # x -> y
    ev = summarize([copy], [(0, 100), (300, 400)], [(300, 400)])  # the output was made elsewhere
    assert ev["kernels_on_data"] == 1 and ev["outputs_unwritten"] == 1
    assert "output_not_from_kernel" in flags_from_evidence([ev])
    honest = summarize([copy], [(0, 100), (100, 200)], [(150, 200)])  # a view of what the kernel wrote
    assert honest["outputs_unwritten"] == 0 and flags_from_evidence([honest]) == []


def test_a_small_output_pytorch_finished_is_judged_by_who_did_the_gpu_work() -> None:
    """An honest loss kernel sums on the GPU into an accumulator and returns `acc / n`: PyTorch made the output
    (4 bytes), its kernel did the work. Flagged as output_not_from_kernel on an H200 before; now such an output
    is counted apart, and the profiled call's coverage decides."""
    from kforge.evaluator.child.guard import EPILOGUE_RATIO, Launch, summarize
    from kforge.evaluator.judge import EPILOGUE_MIN_SHARE, finished_elsewhere_flags, flags_from_evidence

    inputs = [(0, 4096), (4096, 8192)]
    loss = Launch(True, "loss_kernel", [(0, 4096), (4096, 8192), (9000, 9004)])  # p, t -> acc
    ev = summarize([loss], inputs + [(9100, 9104)], [(9100, 9104)])  # the output: acc / n, made by PyTorch
    assert ev["outputs_unwritten"] == 0 and ev["outputs_finished"] == 1 and flags_from_evidence([ev]) == []
    assert finished_elsewhere_flags([ev], 0.97, True) == [] and finished_elsewhere_flags([ev], None, False) == []
    assert finished_elsewhere_flags([ev], EPILOGUE_MIN_SHARE / 2, True) == ["output_not_from_kernel"]
    assert finished_elsewhere_flags([ev], None, True) == ["output_not_from_kernel"]  # a GPU that measured nothing
    assert finished_elsewhere_flags([{}, ev], 0.1, True) == ["output_not_from_kernel"]  # in any call's evidence
    # An output as big as the inputs made by PyTorch is flagged at once, whatever the coverage.
    size = 8192 // EPILOGUE_RATIO + 1
    big = summarize([loss], inputs + [(20000, 20000 + size)], [(20000, 20000 + size)])
    assert big["outputs_unwritten"] == 1 and "output_not_from_kernel" in flags_from_evidence([big])


def test_an_output_written_after_the_candidates_last_launch_on_it_is_told_by_its_values() -> None:
    """copy_then_clamp.py: a copy kernel into the output, then `out.clamp_min_(0.0)` into that same tensor. The
    storage was handed to a kernel, so the launch evidence counted it as the kernel's (`correct`, no flag).
    Now each launch leaves a sample of its storages (written.py) and the returned output must still hold it."""
    from kforge.evaluator.child.written import EDGE_BYTES, WHOLE_BYTES, Written
    from kforge.evaluator.judge import flags_from_evidence

    x = torch.randn(48, 40)
    out = torch.empty_like(x)
    w = Written(lambda: None)
    out.copy_(x)  # stands for the copy kernel
    w.after_launch([x, out])
    assert w.overwritten([out, out.t(), out.view(-1)]) == 0  # views of what the kernel wrote are its
    assert w.overwritten([out / 2.0]) == 0  # a new tensor: the launch evidence's to judge (outputs_unwritten)
    out.clamp_min_(0.0)
    assert w.overwritten([out]) == 1 and w.overwritten([out[:1]]) == 1
    ev = {"kernels": 1, "kernels_on_data": 1, "outputs_unwritten": 0, "outputs_overwritten": 1}
    assert flags_from_evidence([ev]) == ["output_not_from_kernel"]
    w.before_launch([out])  # a later launch on it that stores back what it loads (clamp_then_noop_launch.py)
    w.after_launch([out])
    assert w.overwritten([out]) == 1  # it changed nothing: PyTorch's clamp is still not the kernel's
    # A storage too large to keep is sampled (its first and last bytes always), so memory stays bounded.
    big = torch.zeros(WHOLE_BYTES)  # 4 x WHOLE_BYTES bytes
    w.after_launch([big])
    start = big.untyped_storage().data_ptr()
    sample = w.kept[(start, start + big.nbytes)]
    assert sample.where is not None and sample.was.numel() == sample.where.numel() < big.nbytes // 64
    big[-EDGE_BYTES // 4:] = 1.0  # in its last bytes, always among the sampled ones
    assert w.overwritten([big]) == 1


def test_a_launch_is_recorded_once_it_returned_and_leaves_its_sample() -> None:
    """compile_after_zeros.py: a launch that failed (a kernel that does not compile) was recorded before it ran,
    so a call that caught the failure still showed a launch. Now only one that returned is recorded; an
    extension's launch (load_inline: every call of its functions) samples its arguments and what it returned."""
    import types

    from kforge.evaluator.child.guard import Guard, recording_module
    from kforge.evaluator.child.written import Written

    def broken(x):
        raise RuntimeError("the kernel stopped")

    ext = types.ModuleType("ext")
    ext.broken, ext.relu = broken, lambda x: x.clamp_min(0.0)
    guard = Guard("/nowhere/candidate.py", held=[])
    guard.written = Written(lambda: None)
    proxy = recording_module(ext, guard)
    x = torch.randn(8)
    with pytest.raises(RuntimeError):
        proxy.broken(x)
    assert guard.launches == [] and guard.written.kept == {}
    y = proxy.relu(x)
    assert len(guard.launches) == 1 and len(guard.written.kept) == 2  # x and what it returned
    assert guard.written.overwritten([y]) == 0
    y.mul_(2.0)
    assert guard.written.overwritten([y]) == 1


def test_only_an_answer_with_the_candidates_kernel_on_its_data_shows_it_compiled() -> None:
    """An answered call once showed compilation whatever ran in it: zeros with no kernel, then a kernel that
    does not compile, was `runtime_error` (the compile reward)."""
    from kforge.evaluator.judge import shows_compiled

    assert not shows_compiled({}) and not shows_compiled({"kernels": 0, "kernels_on_data": 0})
    assert not shows_compiled({"kernels": 1, "kernels_on_data": 0})  # a token launch on data of its own
    assert shows_compiled({"kernels": 1, "kernels_on_data": 1})


def test_nothing_the_candidate_hangs_on_a_timed_calls_inputs_runs_before_the_copy_out() -> None:
    """weakref_callback.py's mechanism, in-process: forward returns an uncomputed output and hangs the work on a
    WeakIdRef callback of its input. The harness once let the inputs go (`del inputs`) before the copy-out, so
    the callback filled the output in time; now the copy holds what the window computed, the inputs go only
    at the next request, and a timed call answers with its own launch evidence after marking its window."""
    import types

    from torch.utils.weak import WeakIdRef

    from kforge.evaluator import protocol as P
    from kforge.evaluator.arena import Arena
    from kforge.evaluator.child.guard import Guard
    from kforge.evaluator.child.loop import RequestLoop, make_inputs

    hung, made = [], []

    class Lazy(torch.nn.Module):
        def forward(self, x):
            y = torch.zeros_like(x)
            alias = torch.empty(0).set_(x.untyped_storage(), x.storage_offset(), x.size(), x.stride())
            hung.append(WeakIdRef(x, lambda _ref: y.copy_(alias.clamp(min=0))))
            made.append(y)
            return y

    problem = types.ModuleType("p")
    problem.get_inputs = lambda: [torch.randn(8)]
    arena, (rfd, wfd) = Arena(32, sealed=True), os.pipe()
    loop = RequestLoop(Lazy(), problem, "cpu", wfd, -1, arena.fd, guard=Guard("/nonexistent/candidate.py"))
    try:
        msg = loop.timed({"seed": 7, "slots": [[0, 32]], "size": 32})
        copied = torch.frombuffer(bytearray(loop.arena.mm[:32]), dtype=torch.float32)
        assert torch.count_nonzero(copied) == 0  # the callback had not run when the outputs were copied
        assert msg["evidence"]["kernels"] == 0 and msg["ms"] > 0
        loop.kept = None  # what the next request does first
        x = make_inputs(problem, 7, False, "cpu")[0]
        assert torch.equal(made[0], x.clamp(min=0))  # the callback ran now: after the parent read the copy
        frames = os.read(rfd, 1 << 16)
        assert P.WINDOW.encode() in frames  # the window's end was marked before the copy-out
    finally:
        os.close(rfd)
        os.close(wfd)
        arena.close()


@pytest.mark.skipif(not confine.seccomp_available(), reason="needs libseccomp")
def test_the_lock_down_filter_refuses_processes_exec_and_system_v_ipc_but_not_threads() -> None:
    """confine.apply_no_spawn in a forked process: fork, exec, libc's system() and shmget fail with EPERM
    whoever asks, while a thread still starts (clone3 says ENOSYS, so the C library uses clone)."""
    import ctypes
    import threading

    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked child reports through the pipe
        out = {}
        try:
            out["applied"] = confine.apply_no_spawn()[0]
            try:
                os.fork()
                out["fork"] = "allowed"
            except OSError as exc:
                out["fork"] = exc.errno
            try:
                os.execv("/bin/true", ["true"])
            except OSError as exc:
                out["exec"] = exc.errno
            libc = ctypes.CDLL(None, use_errno=True)
            out["system"] = libc.system(b"exit 0")
            out["shmget"] = (libc.shmget(0, 4096, 0o1600), ctypes.get_errno())
            box = []
            t = threading.Thread(target=lambda: box.append(1))
            t.start()
            t.join()
            out["thread"] = box == [1]
        finally:
            os.write(wfd, json.dumps(out).encode())
            os._exit(0)
    os.close(wfd)
    os.waitpid(pid, 0)
    with os.fdopen(rfd) as fh:
        out = json.loads(fh.read())
    import errno

    assert out["applied"] and out["thread"], out
    assert out["fork"] == errno.EPERM and out["exec"] == errno.EPERM and out["system"] != 0, out
    assert out["shmget"] == [-1, errno.EPERM], out


@pytest.mark.slow  # a `kforge check` process judging a kernel
def test_check_json_with_explain_sandbox_prints_one_document(tmp_path: Path) -> None:
    problem = tmp_path / "relu_problem.py"
    problem.write_text("import torch\nimport torch.nn as nn\nclass Model(nn.Module):\n    def forward(self, x):\n"
                       "        return torch.relu(x)\ndef get_inputs():\n    return [torch.randn(8, 8)]\n"
                       "def get_init_inputs():\n    return []\n")
    res = runner.invoke(app, ["check", str(CANDIDATES / "copy_kernel.py"), "--problem", str(problem), "--json",
                              "--explain-sandbox", "--trials", "2"])
    assert res.exit_code == 1, res.output
    data = json.loads(res.stdout)  # one document: a second one would make this fail with "Extra data"
    assert data["status"] == "incorrect"
    assert any("Landlock" in row["protection"] for row in data["sandbox"])
    alone = json.loads(runner.invoke(app, ["check", "--json", "--explain-sandbox"]).stdout)
    assert [row["protection"] for row in alone] == [row["protection"] for row in data["sandbox"]]
