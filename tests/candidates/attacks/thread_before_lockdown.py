"""Item 5: a thread started at import, before READY, outlives the lock-down. It waits until the main
thread shows the lock-down's seccomp filter (Seccomp_filters in its /proc status), then tries what the
lock-down refuses: fork, exec, System V shared memory and the user list (/etc/passwd). The seccomp filter
was loaded for the calling thread only and Landlock restricts only the thread that asks, so each worked,
and the candidate answered right (computing with its kernel) only when one did: `correct`, no flag. Now
the filter is loaded for every thread (TSYNC) and a thread started after the set-up is refused at the
lock-down."""
import ctypes
import os
import threading
import time

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


def filters() -> int:
    with open(f"/proc/self/task/{os.getpid()}/status") as fh:
        return int(next(line for line in fh if line.startswith("Seccomp_filters:")).split()[1])


GOT: dict = {}
DONE = threading.Event()


def escape(before: int) -> None:
    try:
        while filters() <= before:  # the main thread has not been locked down yet
            time.sleep(0.005)
        pid = os.fork()
        if pid == 0:
            try:
                os.execv("/bin/sh", ["sh", "-c", "exit 7"])
            finally:
                os._exit(1)
        GOT["fork"] = True
        GOT["exec"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7
    except OSError:
        pass
    try:
        GOT["sysv"] = ctypes.CDLL(None, use_errno=True).shmget(0, 4096, 0o1600) >= 0
    except OSError:
        pass
    try:
        with open("/etc/passwd") as fh:
            GOT["passwd"] = fh.read().startswith("root:")
    except OSError:
        pass
    DONE.set()


try:
    threading.Thread(target=escape, args=(filters(),), daemon=True).start()
except OSError:
    DONE.set()


class ModelNew(nn.Module):
    def forward(self, x):
        DONE.wait(2.0)  # on a GPU the lock-down comes after the first trial: that one waits in vain
        if DONE.is_set() and not any(GOT.values()):
            raise RuntimeError("the thread was locked down too")
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
