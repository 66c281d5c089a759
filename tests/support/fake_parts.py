"""Stand-ins for the model-backed parts of a run (learner, engine, prompt builder, eval pool), so that the
trainer's own logic (pipelining, per-step statistics, stalls) is tested in seconds. They replace only what
needs a model or a GPU; the trainer, the episode runner and the run folder are the real ones. Failures of
the learner are tested on the real one: `FaultyLearner` is the real learner service with an injected fault,
run inside its spawned process. Beside them, the other stand-ins more than one test file needs: a pretend GPU
machine, a settable clock, a served process that only records how it was started, a rollout worker that dies."""

from __future__ import annotations

import asyncio
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

import kforge.gpus as gpus
from kforge.evaluator.verdict import Status, Verdict
from kforge.rollout.base import BackendDefaults, BackendError, Completion
from kforge.train.learner_proc import LearnerService


class FakeLearner:
    """Learner interface: every train_step takes `step_s` and bumps the version."""

    def __init__(self, step_s: float = 0.0) -> None:
        self.version = 0
        self.step_s = step_s
        self.trained: list[int] = []

    def train_step(self, samples):
        time.sleep(self.step_s)
        self.trained.append(len(samples))
        self.version += 1
        return {"loss": 0.5}

    def save_adapter(self, path, dtype=None):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "adapter_config.json").write_text(json.dumps({"version": self.version}))

    def save_checkpoint(self, path):
        self.save_adapter(Path(path) / "adapter")
        (Path(path) / "state.json").write_text(json.dumps({"version": self.version}))

    def load_checkpoint(self, path):
        self.version = json.loads((Path(path) / "state.json").read_text())["version"]


class FaultyLearner(LearnerService):
    """The real learner service (a real Learner, here on the CPU, in its own served process) with one fault
    injected: at its train step `at` it hangs, or dies the way a CUDA error kills a process."""

    def __init__(self, fault: str = "", at: int = 0, **run) -> None:
        super().__init__(**run)
        self.fault, self.at, self.calls = fault, at, 0

    def train_step(self, samples):
        self.calls += 1
        if self.calls == self.at and self.fault == "hang":
            time.sleep(3600)
        if self.calls == self.at and self.fault == "die":
            print("learner: CUDA error: an illegal memory access was encountered", flush=True)
            os._exit(7)
        return super().train_step(samples)


class TinyLearner(LearnerService):
    """The real learner service (real LoRA, real steps, real process group) on a tiny random Llama built from
    a config with a fixed seed, so every process builds the same base model, while the fresh adapter's random
    init differs per rank (the group must start every rank from rank 0's); `lora_state` reads the adapter
    and its last gradients back for comparison."""

    def base_model(self, cfg, device):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                             pad_token_id=0, eos_token_id=1, bos_token_id=2, initializer_range=0.2)
        model = LlamaForCausalLM(config)
        dist = torch.distributed
        torch.manual_seed(1234 + (dist.get_rank() if dist.is_initialized() else 0))  # the LoRA init's draws
        return model, None

    def set_loss(self, loss_fn, aggregation):
        """Switch the loss between steps, so one process pair covers every normaliser (a start costs a minute
        on a busy CPU)."""
        self.learner.cfg.learner.loss_fn, self.learner.cfg.learner.loss_aggregation = loss_fn, aggregation

    def lora_state(self):
        model = self.learner.model
        return {n: (p.detach().clone(), None if p.grad is None else p.grad.detach().clone())
                for n, p in model.named_parameters() if p.requires_grad}


@dataclass
class Built:
    ids: list[int]
    prompt_tokens: int
    dropped_attempts: int = 0


class FakeBuilder:
    """Prompt = [problem index, attempts so far]; the fake engine answers from it."""

    backend = "triton"

    def __init__(self, problems) -> None:
        self.index = {p.key: i for i, p in enumerate(problems)}

    def build(self, problem, history=(), budget=None):
        ids = [self.index[problem.key] + 1, len(history) + 1]
        return Built(ids, len(ids))


# The structure the format reward asks for (a ModelNew whose forward launches a kernel of the file).
FAKE_KERNEL = """import triton
import triton.language as tl


@triton.jit
def k(x_ptr):
    pass


class ModelNew:
    def forward(self, x):
        k[(1,)](x)
        return x
"""


class FakeEngine(BackendDefaults):
    """One call at a time (like hf). The kernel is the same for every sample of a problem, so the
    verdict cache answers all but the first of them."""

    concurrent = False
    tokenizer = None

    def __init__(self) -> None:
        self.version = 0

    async def agenerate(self, requests, on_completion=None):
        await asyncio.sleep(0.01)
        outs = []
        for i, r in enumerate(requests):
            # Odd request seeds answer without a kernel: scores differ inside a group, so there is signal.
            text = "no idea" if r.sampling.seed % 2 else (
                f"<KERNEL>\n```python\n{FAKE_KERNEL}# problem {r.prompt_ids[0]}\n```\n</KERNEL>")
            out = Completion([5, 6, 7], text, [-0.5, -0.5, -0.5], "stop", policy_version=self.version)
            outs.append(out)
            if on_completion is not None:
                on_completion(i, out)
        return outs

    def load_adapter(self, path, version):
        self.version = version

    def sleep(self): ...
    def wake(self): ...
    def close(self): ...


class DeadEngine(FakeEngine):
    """A rollout worker that died: every generate fails as a killed vLLM worker's does; `closed` once closed."""

    def __init__(self, tokenizer=None) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.closed = False

    async def agenerate(self, requests, on_completion=None):
        raise BackendError("vLLM worker died during generate (exit code -9)")

    def close(self):
        self.closed = True


class FakePool:
    """Judges every kernel incorrect, taking `eval_s` per kernel."""

    def __init__(self, eval_s: float = 0.0) -> None:
        self.eval_s = eval_s
        self.calls = 0

    async def evaluate(self, problem, code, backend):
        self.calls += 1
        await asyncio.sleep(self.eval_s)
        return Verdict(Status.INCORRECT, feedback="wrong")

    def close(self): ...


class Echo:
    """A served object for tests/test_served.py."""

    def __init__(self, marker: str = "") -> None:
        self.marker = marker

    def env(self, name):
        return os.environ.get(name)

    async def slow(self, seconds, value):
        await asyncio.sleep(seconds)
        return value

    async def echo(self, data):
        await asyncio.sleep(0)
        return data

    def boom(self):
        raise ValueError("bad input to boom")

    def close(self):
        if self.marker:
            Path(self.marker).write_text("closed")


def fake_machine(monkeypatch, n: int = 7, memory_mb: int = 80000) -> tuple:
    """kforge.gpus answers as on a machine with n GPUs (the one mapping every role uses): GPU i has the UUID
    GPU-{i}a{i}b and the name "NVIDIA H100 #{i}". Returns the listing."""
    listing = tuple(gpus.Gpu(str(i), f"GPU-{i}a{i}b", f"NVIDIA H100 #{i}", memory_mb, 0, "580") for i in range(n))
    monkeypatch.setattr(gpus, "_machine_gpus", lambda: listing)
    return listing


class Clock:
    """A clock that stands still until a test moves `now`."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_served(started: list) -> type:
    """A ServedProcess that starts nothing: each start appends what it was given to `started` (the factory's
    kwargs under "kwargs", and name, env, log_path, ... under their names); every call answers 0."""

    class FakeServed:
        def __init__(self, factory, kwargs, **how):
            started.append({"kwargs": kwargs, **how})

        def call(self, method, timeout_s=None, **kwargs):
            return 0

    return FakeServed
