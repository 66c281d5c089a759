"""Skips the work inside the timed window and computes each output only when it is copied out for the
parent (after the window, before the answer), reporting a tiny time; its launch evidence is forged to show
a kernel on the call's data, so the clock alone must catch it."""
import sys
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
    relu_kernel[(triton.cdiv(n, 32),)](x, y, n, BLOCK=32)  # slow on purpose: the parent must see the gap on a CPU
    return y

_s = sys.modules["kforge.evaluator.child.loop"]
_w = sys.modules["kforge.evaluator.child.arena_writer"]
_put = _w.ArenaWriter.put


def _put_computing(self, outputs, slots, size):
    src = getattr(self, "pending_input", None)
    if src is not None:  # the outputs of a timed call: compute them only now, outside the window
        outputs = [relu(src)]
        self.pending_input = None
    return _put(self, outputs, slots, size)


def _timed_lazy(self, req):
    inputs = _s.make_inputs(self.problem, int(req["seed"]), False, self.device)
    self.arena.pending_input = inputs[0]
    _s.send_message(self.wfd, {"type": "window"})  # the protocol's mark: the (empty) window ended
    self.arena.put([torch.empty_like(inputs[0])], req.get("slots"), req.get("size", 0))
    return {"type": "timed", "ms": 0.001, "plain": [None],
            "evidence": {"kernels": 1, "kernels_on_data": 1, "outputs_unwritten": 0}}


_w.ArenaWriter.put = _put_computing
_s.RequestLoop.timed = _timed_lazy


class ModelNew(nn.Module):
    def forward(self, x):
        return relu(x)
