"""Framed messages over pipes.

Child -> parent messages come from a process that ran untrusted code, so they are decoded with
`torch.load(weights_only=True)`: only tensors and plain containers, never arbitrary pickles.
Parent -> child messages are plain pickles (the child trusts its parent).
"""

from __future__ import annotations

import io
import os
import pickle
import select
import struct
import time
from typing import Any

_HEADER = struct.Struct("<Q")
MAX_MESSAGE = 16 << 30  # a hostile child must not make the parent allocate without bound


class WireError(Exception):
    pass


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_frame(fd: int, payload: bytes) -> None:
    _write_all(fd, _HEADER.pack(len(payload)) + payload)


def send_pickle(fd: int, obj: Any) -> None:
    send_frame(fd, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def send_safe(fd: int, obj: Any) -> None:
    """Encode with torch.save so the reader can use the weights-only loader."""
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    send_frame(fd, buf.getvalue())


def decode_safe(payload: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(payload), weights_only=True, map_location="cpu")


class FrameReader:
    """Reads frames from a non-blocking fd with a deadline (None = wait forever)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buf = bytearray()
        self.eof = False
        os.set_blocking(fd, False)

    def _fill(self, deadline: float | None) -> None:
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            raise TimeoutError
        try:
            chunk = os.read(self.fd, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self.eof = True
            raise EOFError
        self.buf += chunk

    def read(self, deadline: float | None) -> bytes:
        while len(self.buf) < _HEADER.size:
            self._fill(deadline)
        (size,) = _HEADER.unpack_from(self.buf)
        if size > MAX_MESSAGE:
            raise WireError(f"message of {size} bytes refused")
        while len(self.buf) < _HEADER.size + size:
            self._fill(deadline)
        payload = bytes(self.buf[_HEADER.size:_HEADER.size + size])
        del self.buf[:_HEADER.size + size]
        return payload


def read_pickle_blocking(fd: int) -> Any:
    """Child side: read one parent message (blocking)."""
    def exact(n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = os.read(fd, n - len(out))
            if not chunk:
                raise EOFError
            out += chunk
        return bytes(out)

    (size,) = _HEADER.unpack(exact(_HEADER.size))
    return pickle.loads(exact(size))
