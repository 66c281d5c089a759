"""One object served in a spawned process: how the learner and the vLLM engine run beside the trainer.

Why a process: a role must see only its own GPUs (CUDA_VISIBLE_DEVICES has to be set before torch
initialises CUDA), its CUDA state and crashes must not reach the trainer, and a hang must be noticed.

- The environment is in place when the child's interpreter starts (set around `start()` under a lock,
  and again in the child before the object's module is imported).
- Ready handshake: the constructor returns once the child built the object, or raises with its error.
- Every call has an id and a deadline (the call's own, else the process's `call_timeout_s`); several
  calls may be in flight (a coroutine method of the object runs concurrently in the child's event loop,
  a plain method runs in arrival order).
- No thread ever blocks on the pipe while holding what another needs: requests go out through one writer
  thread (a caller never waits for the child to read), and the reader thread drains answers without
  waiting for any caller. Both ends of a pipe fill up when many large calls are in flight; a send under
  the lock that the reader needs to deliver answers would stop both processes for good.
- Liveness: a reader thread notices a dead child at once and fails every pending call with its exit
  code and the child's last error (the tail of its log file, or the last traceback it sent).
- A call past its deadline marks the process hung; later calls fail at once and `close()` kills it.
- Ordered close: the child finishes its in-flight calls, calls the object's `close()`, answers and exits;
  a child that does not is terminated, then killed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import importlib
import itertools
import multiprocessing as mp
import os
import queue
import threading
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any, Awaitable, Callable

if TYPE_CHECKING:
    from multiprocessing.connection import Connection

_ENV_LOCK = threading.Lock()
# Held while a start has put a child's variables into this process's environment: read the parent's own
# variables (CUDA_VISIBLE_DEVICES) under it, or another thread's start shows through.
ENV_LOCK = _ENV_LOCK
_CLOSE = "__close__"


class ServedError(RuntimeError):
    """The served process failed; the first line of the message says what, for the user."""


class ProcessDied(ServedError):
    pass


class CallTimeout(ServedError):
    pass


class CallFailed(ServedError):
    """The object's method raised in the child; `child_traceback` holds the child's traceback."""

    def __init__(self, message: str, child_traceback: str = "") -> None:
        super().__init__(message)
        self.child_traceback = child_traceback


def resolve(spec: str) -> Callable[..., object]:
    """`package.module:Name.attr` -> the object."""
    module, _, name = spec.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


# ---------------------------------------------------------------------------------------------- child side
def _child_main(conn: Connection, env: dict[str, str], log_path: str | None, factory: str, kwargs: dict[str, Any]) -> None:
    os.environ.update(env)  # before the factory's module (and torch) is imported
    if log_path:
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    asyncio.run(_serve(conn, factory, kwargs))


async def _serve(conn: Connection, factory: str, kwargs: dict[str, Any]) -> None:
    loop = asyncio.get_running_loop()
    send_lock = threading.Lock()

    def reply(kind: str, cid: int, payload: object) -> None:
        with send_lock:
            try:
                conn.send((kind, cid, payload))
            except Exception:  # an unpicklable result: say so rather than dying
                if kind != "ok":
                    raise
                conn.send(("error", cid, _tail(traceback.format_exc())))

    try:
        obj = resolve(factory)(**kwargs)
    except BaseException:
        reply("error", 0, _tail(traceback.format_exc()))
        return
    reply("ok", 0, {"pid": os.getpid(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES")})
    inflight: set[asyncio.Task] = set()

    async def run_async(cid: int, fn: Callable[..., Awaitable[object]], call_kwargs: dict[str, Any]) -> None:
        try:
            reply("ok", cid, await fn(**call_kwargs))
        except BaseException:
            reply("error", cid, _tail(traceback.format_exc()))

    while True:
        try:
            cid, method, call_kwargs = await loop.run_in_executor(None, conn.recv)
        except (EOFError, OSError):  # the parent is gone
            return
        if method == _CLOSE:
            await asyncio.gather(*inflight, return_exceptions=True)
            close = getattr(obj, "close", None)
            try:
                if close is not None:
                    result = close()
                    if asyncio.iscoroutine(result):
                        await result
                reply("ok", cid, None)
            except BaseException:
                reply("error", cid, _tail(traceback.format_exc()))
            return
        try:
            fn = getattr(obj, method)
        except AttributeError:
            reply("error", cid, f"AttributeError: the served object has no method {method!r}")
            continue
        if asyncio.iscoroutinefunction(fn):
            task = asyncio.ensure_future(run_async(cid, fn, call_kwargs))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
        else:
            try:
                reply("ok", cid, fn(**call_kwargs))
            except BaseException:
                reply("error", cid, _tail(traceback.format_exc()))


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


# --------------------------------------------------------------------------------------------- parent side
class ServedProcess:
    """The parent's handle: `call` (blocking) and `acall` (awaitable) with deadlines, `close`."""

    def __init__(
        self,
        factory: str,
        kwargs: dict[str, Any] | None = None,
        *,
        name: str,
        env: dict[str, str] | None = None,
        log_path: str | Path | None = None,
        start_timeout_s: float | None = 1200.0,
        call_timeout_s: float | None = None,
        daemon: bool = True,
    ) -> None:
        self.name = name
        self.call_timeout_s = call_timeout_s  # the deadline of a call that names none
        self.log_path = str(log_path) if log_path else None
        self.info: dict[str, Any] = {}
        self.last_error = ""
        self._hung = ""  # why calls are refused (a call passed its deadline)
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[str, cf.Future]] = {}
        self._lock = threading.Lock()  # guards _pending only; never held around pipe I/O
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        self._reader_done = False
        self._closed = False
        # KFORGE_ROLE names the role in the process's environment (inherited by what it starts, such as
        # vLLM's engine core), so tools that see only pids (nvidia-smi, NVML, ps e) can tell roles apart.
        env = {"KFORGE_ROLE": name, **(env or {})}
        ctx = mp.get_context("spawn")
        self._conn, child_conn = ctx.Pipe()
        self._proc = ctx.Process(target=_child_main, args=(child_conn, env, self.log_path, factory, kwargs or {}),
                                 name=f"kforge-{name}", daemon=daemon)
        ready: cf.Future = cf.Future()
        self._pending[0] = ("start", ready)
        with _ENV_LOCK:  # the spawned interpreter starts with the environment of this moment
            saved = {k: os.environ.get(k) for k in env}
            os.environ.update(env)
            try:
                self._proc.start()
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
                    else:
                        os.environ[k] = v
        child_conn.close()
        self._reader = threading.Thread(target=self._read, name=f"kforge-{name}-reader", daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write, name=f"kforge-{name}-writer", daemon=True)
        self._writer.start()
        try:
            self.info = self._wait(ready, start_timeout_s, "start")
        except ServedError:
            self.close(timeout_s=5)
            raise

    # ------------------------------------------------------------------ reading
    def _read(self) -> None:
        while True:
            try:
                if not self._conn.poll(0.2):
                    if not self._proc.is_alive():
                        self._proc.join(timeout=1)
                        break
                    continue
                kind, cid, payload = self._conn.recv()
            except (EOFError, OSError):
                self._proc.join(timeout=5)
                break
            with self._lock:
                entry = self._pending.pop(cid, None)
            if kind == "error":
                self.last_error = payload
            if entry is None:
                continue  # the answer to a call that already timed out
            method, fut = entry
            if kind == "ok":
                _settle(fut, result=payload)
            else:
                last = payload.strip().splitlines()[-1] if payload.strip() else "unknown error"
                _settle(fut, error=CallFailed(f"{self.name}.{method} failed in its process: {last}", payload))
        with self._lock:
            pending, self._pending = self._pending, {}
            self._reader_done = True  # from now on a call fails at once: no one would read its answer
        for method, fut in pending.values():
            _settle(fut, error=ProcessDied(self._death(method)))

    def _write(self) -> None:
        """Send queued requests in order. A send blocks while the child's end is full, which is harmless
        here: the reader keeps draining answers, so the child keeps reading requests."""
        while True:
            item = self._outbox.get()
            if item is None:
                return
            cid, method, kwargs = item
            try:
                self._conn.send((cid, method, kwargs))
            except (OSError, ValueError) as exc:  # the child is gone, or the pipe was closed
                self._fail(cid, ProcessDied(self._death(method)) if not isinstance(exc, ValueError)
                           else ServedError(f"{self.name} process is closed ({method})"))
            except Exception as exc:  # an unpicklable argument: that call fails, the others go on
                self._fail(cid, ServedError(f"{self.name}.{method}: its arguments cannot be sent ({exc})"))

    def _fail(self, cid: int, error: BaseException) -> None:
        with self._lock:
            entry = self._pending.pop(cid, None)
        if entry is not None:
            _settle(entry[1], error=error)

    def _death(self, method: str) -> str:
        code = self._proc.exitcode
        why = f"{self.name} process died during {method} (exit code {code})"
        last = self._last_words()
        return why + (f"; its last output:\n{last}" if last else "")

    def _last_words(self, lines: int = 8) -> str:
        if self.log_path and os.path.exists(self.log_path):
            try:
                text = Path(self.log_path).read_text(errors="replace")
                return "\n".join(text.strip().splitlines()[-lines:])
            except OSError:
                pass
        return "\n".join(self.last_error.strip().splitlines()[-lines:])

    # ------------------------------------------------------------------ calls
    def _submit(self, method: str, kwargs: dict[str, Any]) -> cf.Future:
        fut: cf.Future = cf.Future()
        if self._closed:
            fut.set_exception(ServedError(f"{self.name} process is closed ({method})"))
            return fut
        if self._hung:
            fut.set_exception(CallTimeout(self._hung))
            return fut
        if not self._proc.is_alive():
            fut.set_exception(ProcessDied(self._death(method)))
            return fut
        cid = next(self._ids)
        with self._lock:
            if self._reader_done:
                fut.set_exception(ProcessDied(self._death(method)))
                return fut
            self._pending[cid] = (method, fut)
        self._outbox.put((cid, method, kwargs))
        return fut

    def _timed_out(self, method: str, timeout_s: float) -> CallTimeout:
        self._hung = f"{self.name} did not answer {method} within {timeout_s:g} s (hung or overloaded)"
        return CallTimeout(self._hung)

    def _wait(self, fut: cf.Future, timeout_s: float | None, method: str) -> Any:  # noqa: ANN401  the served object's answer: whatever its method returns
        try:
            return fut.result(timeout=timeout_s)
        except cf.TimeoutError:
            raise self._timed_out(method, timeout_s or 0.0) from None

    def call(self, method: str, timeout_s: float | None = None, **kwargs: object) -> Any:  # noqa: ANN401  the served object's answer: whatever its method returns
        """Run `obj.method(**kwargs)` in the child and return its result; raises within `timeout_s`."""
        timeout_s = timeout_s if timeout_s is not None else self.call_timeout_s
        return self._wait(self._submit(method, kwargs), timeout_s, method)

    async def acall(self, method: str, timeout_s: float | None = None, **kwargs: object) -> Any:  # noqa: ANN401  the served object's answer: whatever its method returns
        timeout_s = timeout_s if timeout_s is not None else self.call_timeout_s
        fut = asyncio.wrap_future(self._submit(method, kwargs))
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            raise self._timed_out(method, timeout_s or 0.0) from None

    def alive(self) -> bool:
        return self._proc.is_alive() and not self._hung

    @property
    def pid(self) -> int | None:
        return self._proc.pid

    # ------------------------------------------------------------------ close
    def close(self, timeout_s: float = 60.0) -> None:
        """Ask the child to finish and close its object; terminate, then kill, what does not."""
        if self._closed:
            return
        if self._proc.is_alive() and not self._hung:
            try:
                self._wait(self._submit(_CLOSE, {}), timeout_s, "close")
            except ServedError:
                pass
        self._closed = True
        self._proc.join(timeout=5 if not self._hung else 0.1)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)
        self._reader.join(timeout=2)
        self._outbox.put(None)
        self._writer.join(timeout=2)
        try:
            self._conn.close()
        except OSError:
            pass


def _settle(fut: cf.Future, result: object = None, error: BaseException | None = None) -> None:
    """Complete a call's future unless its caller already gave up on it (cancelled, e.g. by a deadline):
    the reader must outlive every caller, or no later call is ever answered."""
    try:
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)
    except cf.InvalidStateError:
        pass

