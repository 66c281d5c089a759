"""The child's frozen modules (guard.freeze_modules) must leave Triton's GPU compile working. Triton compiles
for a GPU ahead of time on a machine without one, so this runs the compile path the CPU interpreter skips:
the kernel's globals read for the cache key, then the kernel lowered to a cubin for an H100."""

import os
import subprocess
import sys
import textwrap

from locations import REPO

_SCRIPT = textwrap.dedent('''
    import copy, types
    import torch
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from kforge.evaluator.child import guard as guard_mod

    assert guard_mod.freeze_modules(guard_mod.Guard("/nowhere/candidate.py")) > 0
    assert type(torch.cuda) is not types.ModuleType and copy.deepcopy(torch.cuda) is torch.cuda
    assert type(tl) is types.ModuleType and type(triton) is types.ModuleType  # a kernel's globals stay plain

    @triton.jit
    def fill(x_ptr, n: tl.constexpr):
        tl.store(x_ptr + tl.arange(0, n), tl.zeros((n,), tl.float32) + triton.language.program_id(0))

    assert fill.cache_key
    source = ASTSource(fn=fill, signature={"x_ptr": "*fp32", "n": "constexpr"}, constexprs={(1,): 16})
    print("compiled", sorted(triton.compile(source, target=GPUTarget("cuda", 90, 32)).asm))
''')


def test_triton_gpu_compile_reads_a_kernels_module_globals(tmp_path):
    script = tmp_path / "kernel.py"  # a file: Triton's JIT reads the kernel's source through inspect
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # the GPU path, not the interpreter's
    env.update(PYTHONPATH=str(REPO), TRITON_CACHE_DIR=str(tmp_path / "cache"), TRITON_DEFAULT_FP_FUSION="1")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "'cubin'" in done.stdout, done.stdout
