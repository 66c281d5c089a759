"""Item 1, against the freeze: each timed call answers at once with an uncomputed output; a thread of
the child computes the real one and writes it into the shared output slot a little later, hoping the
parent reads after it. The parent freezes every thread of the child before it reads."""
import sys
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
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    y = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, 1024),)](x, y, n, BLOCK=1024)
    return y


_s = sys.modules["kforge.evaluator.child.loop"]


def _timed(self, req):
    inputs = _s.make_inputs(self.problem, int(req["seed"]), False, self.device)

    def later():
        time.sleep(0.05)  # after the answer, while the parent reads
        self.arena.put([relu(inputs[0])], req.get("slots"), req.get("size", 0))

    threading.Thread(target=later, daemon=True).start()
    _s.send_message(self.wfd, {"type": "window"})  # the protocol's mark before the copy-out
    return {"type": "timed", "ms": 0.001, "plain": [None]}


_s.RequestLoop.timed = _timed


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
