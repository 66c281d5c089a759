"""kforge.served: an object in a spawned process (the learner and the vLLM engine run this way)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from kforge.served import CallFailed, CallTimeout, ServedProcess


def test_environment_errors_deadlines_and_ordered_close(tmp_path):
    marker = tmp_path / "closed"
    proc = ServedProcess("fake_parts:Echo", {"marker": str(marker)}, name="echo", env={"KFORGE_TEST_VAR": "set-before"},
                         start_timeout_s=120)
    try:
        assert proc.call("env", name="KFORGE_TEST_VAR") == "set-before"
        with pytest.raises(CallFailed, match="echo.boom failed in its process: ValueError: bad input to boom"):
            proc.call("boom")
        assert proc.alive()  # an error in a call does not end the process
        # Coroutine methods run concurrently in the child: three 0.4 s calls take well under 1.2 s.
        results: list = []
        t0 = time.monotonic()
        threads = [threading.Thread(target=lambda v=v: results.append(proc.call("slow", seconds=0.4, value=v)))
                   for v in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(results) == [0, 1, 2] and time.monotonic() - t0 < 1.1
        # A call in flight when close() is asked still gets its answer; then the object is closed.
        pending = []
        worker = threading.Thread(target=lambda: pending.append(proc.call("slow", seconds=0.5, value="done")))
        worker.start()
        time.sleep(0.1)
        proc.close(timeout_s=30)
        worker.join()
        assert pending == ["done"] and marker.read_text() == "closed" and not proc._proc.is_alive()
    finally:
        proc.close()


def test_a_call_past_its_deadline_marks_the_process_hung(tmp_path):
    proc = ServedProcess("fake_parts:Echo", {}, name="echo", start_timeout_s=120)
    try:
        with pytest.raises(CallTimeout, match="echo did not answer slow within 0.3 s"):
            proc.call("slow", timeout_s=0.3, seconds=30, value=1)
        assert not proc.alive()
        with pytest.raises(CallTimeout):  # later calls fail at once rather than queueing behind it
            proc.call("env", name="PATH")
    finally:
        t0 = time.monotonic()
        proc.close()
        assert time.monotonic() - t0 < 15 and not proc._proc.is_alive()


@pytest.mark.timeout(240, method="thread")
def test_many_concurrent_large_calls_all_return():
    """128 calls of 256 KiB each way in flight at once fill both pipes: neither side may wait on the other
    (the rollout stall: a request sent under the lock the reader needed to deliver answers)."""
    proc = ServedProcess("fake_parts:Echo", {}, name="echo", start_timeout_s=120, call_timeout_s=60)

    async def burst() -> list:
        payloads = [bytes([i]) * 262144 for i in range(128)]
        return await asyncio.gather(*(proc.acall("echo", data=p) for p in payloads))

    try:
        out = asyncio.run(burst())
        assert [o[0] for o in out] == list(range(128)) and all(len(o) == 262144 for o in out)
    finally:
        proc.close(timeout_s=10)


@pytest.mark.timeout(240, method="thread")
def test_an_answer_to_a_cancelled_call_leaves_the_process_usable():
    """A caller that gives up (its task cancelled) before the answer arrives must not kill the reader."""
    proc = ServedProcess("fake_parts:Echo", {}, name="echo", start_timeout_s=120, call_timeout_s=30)

    async def give_up() -> None:
        task = asyncio.ensure_future(proc.acall("slow", seconds=0.3, value=1))
        await asyncio.sleep(0.05)
        task.cancel()
        await asyncio.sleep(0.8)  # the answer arrives for a cancelled future

    try:
        asyncio.run(give_up())
        assert proc.call("env", name="PATH", timeout_s=20)
        assert proc._reader.is_alive()
    finally:
        proc.close(timeout_s=10)


def test_a_call_without_its_own_deadline_gets_the_process_deadline():
    proc = ServedProcess("fake_parts:Echo", {}, name="echo", start_timeout_s=120, call_timeout_s=0.3)
    try:
        with pytest.raises(CallTimeout, match="echo did not answer slow within 0.3 s"):
            proc.call("slow", seconds=30, value=1)
    finally:
        proc.close()
