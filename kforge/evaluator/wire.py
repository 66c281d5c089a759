"""Framed messages over pipes.

Child -> parent messages come from a process that ran untrusted code, so they carry no pickle at
all: a frame is a JSON header (plain values, with tensors replaced by `{"__t__": i}`) followed by the
raw bytes of each tensor, described by dtype (from an allow-list), shape and length. The parent
bounds every frame by the size it expects before reading it (`FrameReader.read(..., max_bytes)`).

Parent -> child messages are plain pickles (the child trusts its parent).
"""

from __future__ import annotations

import json
import os
import pickle
import select
import struct
import time
from typing import Any

_HEADER = struct.Struct("<Q")
_SPLIT = struct.Struct("<I")  # length of the JSON part inside a frame
SMALL_MESSAGE = 1 << 20  # default bound for a message that carries no outputs

_DTYPES = ("float16", "bfloat16", "float32", "float64", "complex64", "complex128", "int8", "int16", "int32",
           "int64", "uint8", "bool")


class WireError(Exception):
    """A frame the protocol does not allow (too big, malformed, unknown dtype)."""


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def send_frame(fd: int, payload: bytes) -> None:
    _write_all(fd, _HEADER.pack(len(payload)) + payload)


def send_pickle(fd: int, obj: object) -> None:
    send_frame(fd, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


# ---------------------------------------------------------------------------------------------
# child -> parent: JSON + raw tensors
# ---------------------------------------------------------------------------------------------


def encode(obj: object) -> bytes:
    """A message with tensors anywhere inside lists/dicts (CPU copies are made here)."""
    import torch

    blobs: list[bytes] = []
    metas: list[dict[str, Any]] = []

    def walk(x: object) -> object:
        if isinstance(x, torch.Tensor):
            t = x.detach().to("cpu").contiguous()
            name = str(t.dtype).removeprefix("torch.")
            if name not in _DTYPES:
                raise WireError(f"dtype {name} cannot be sent")
            raw = t.reshape(-1).view(torch.uint8) if t.numel() and t.dtype != torch.bool else t.reshape(-1)
            data = raw.numpy().tobytes() if t.numel() else b""
            metas.append({"dtype": name, "shape": list(t.shape), "n": len(data)})
            blobs.append(data)
            return {"__t__": len(metas) - 1}
        if isinstance(x, dict):
            return {str(k): walk(v) for k, v in x.items()}
        if isinstance(x, (list, tuple)):
            return [walk(v) for v in x]
        if x is None or isinstance(x, (bool, int, float, str)):
            return x
        return repr(x)[:200]  # anything else travels as text, never as an object

    body = json.dumps({"msg": walk(obj), "tensors": metas}).encode()
    return _SPLIT.pack(len(body)) + body + b"".join(blobs)


def send_message(fd: int, obj: object) -> None:
    send_frame(fd, encode(obj))


MAX_DIM = 1 << 40  # no real output has a dimension this long; bigger ones are forged


def decode(payload: bytes) -> Any:  # noqa: ANN401  a message: JSON values and tensors, read by key
    """Inverse of `encode`; raises WireError on anything malformed, and on nothing else (a forged frame
    must end as a protocol violation, never as an exception in the parent)."""
    try:
        return _decode(payload)
    except WireError:
        raise
    except Exception as exc:  # noqa: BLE001 - RecursionError from deep JSON, overflow from shapes, ...
        raise WireError(f"malformed message ({type(exc).__name__})") from None


def _decode(payload: bytes) -> Any:  # noqa: ANN401  as `decode`
    import torch

    try:
        (n,) = _SPLIT.unpack_from(payload)
        head = json.loads(payload[_SPLIT.size:_SPLIT.size + n])
        metas = head["tensors"]
    except (struct.error, ValueError, KeyError, TypeError) as exc:
        raise WireError(f"malformed message: {exc}") from None
    if not isinstance(metas, list):
        raise WireError("malformed tensor table")
    offset = _SPLIT.size + n
    tensors: list[torch.Tensor] = []
    for meta in metas:
        try:
            dtype = getattr(torch, meta["dtype"]) if meta["dtype"] in _DTYPES else None
            shape = [int(s) for s in meta["shape"]]
            size = int(meta["n"])
        except (KeyError, TypeError, ValueError):
            raise WireError("malformed tensor entry") from None
        if dtype is None or size < 0 or offset + size > len(payload) or any(not 0 <= s < MAX_DIM for s in shape):
            raise WireError("tensor entry out of bounds")
        count = 1
        for s in shape:
            count *= s
        if count * torch.empty((), dtype=dtype).element_size() != size:
            raise WireError("tensor size does not match its shape")
        if size:
            raw = bytearray(payload[offset:offset + size])
            t = torch.frombuffer(raw, dtype=torch.uint8 if dtype != torch.bool else torch.bool)
            t = t.view(dtype) if dtype != torch.bool else t
            tensors.append(t.reshape(shape))
        else:
            tensors.append(torch.empty(shape, dtype=dtype))
        offset += size

    def walk(x: object) -> object:
        if isinstance(x, dict):
            if set(x) == {"__t__"}:
                i = x["__t__"]
                if not isinstance(i, int) or not 0 <= i < len(tensors):
                    raise WireError("bad tensor reference")
                return tensors[i]
            return {k: walk(v) for k, v in x.items()}
        if isinstance(x, list):
            return [walk(v) for v in x]
        return x

    return walk(head["msg"])


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

    def read(self, deadline: float | None, max_bytes: int = SMALL_MESSAGE) -> bytes:
        """One frame; WireError when its announced size exceeds `max_bytes` (nothing more is read)."""
        while len(self.buf) < _HEADER.size:
            self._fill(deadline)
        (size,) = _HEADER.unpack_from(self.buf)
        if size > max_bytes:
            raise WireError(f"message of {size} bytes refused (at most {max_bytes} expected)")
        while len(self.buf) < _HEADER.size + size:
            self._fill(deadline)
        payload = bytes(self.buf[_HEADER.size:_HEADER.size + size])
        del self.buf[:_HEADER.size + size]
        return payload


def read_pickle_blocking(fd: int) -> Any:  # noqa: ANN401  the parent's message, read by key
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
