"""Data-parallel rollout: one engine per GPU group behind a router that keeps a problem's requests on one
replica, with adapter syncs sent to every replica. The engines are real worker processes with vLLM's async
engine stood in (`RecordingEngine` of tests/support/recording_engine.py, as in test_vllm_backend: this machine has no
vLLM and no GPU)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from fake_parts import FakeEngine, fake_machine
from kforge.rollout.base import BackendError, GenerationRequest, SamplingParams
from kforge.rollout.factory import _replicas
from kforge.rollout.replicas import NoReplicaLeft, Replicas, RequestFailed
from kforge.rollout.vllm_worker import VLLMBackend
from kforge.train.placement import Memory, PlacementError, plan_placement
from recording_engine import ENGINE, Tok, req


def routed(first: int, route: str) -> GenerationRequest:
    r = req([first, 7])
    return GenerationRequest(r.prompt_ids, r.sampling, route=route)


@pytest.mark.slow  # several worker processes
def test_one_engine_per_gpu_group_a_route_stays_on_its_replica_and_syncs_reach_all(monkeypatch, tmp_path):
    fake_machine(monkeypatch, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def start(cfg, devices, **kwargs):
        return VLLMBackend(Tok(), {}, devices=devices, engine=ENGINE, startup_timeout_s=120, **kwargs)

    backend = _replicas(start, None, [0, 1, 2, 3], 2, {"log_path": str(tmp_path / "rollout.log")})
    try:
        assert len(backend.replicas) == 2
        states = [r._call("state") for r in backend.replicas]
        assert [s["env"]["CUDA_VISIBLE_DEVICES"] for s in states] == ["0,1", "2,3"]  # each its own GPUs
        assert (tmp_path / "rollout.log").exists() and (tmp_path / "rollout.replica1.log").exists()

        order: list[int] = []
        requests = [routed(10, "1/1"), routed(11, "1/2"), routed(12, "1/1"), routed(13, "1/3"), routed(14, "1/2"),
                    routed(15, "1/1")]
        outs = asyncio.run(backend.agenerate(requests, lambda i, c: order.append(i)))
        assert [o.token_ids[-1] for o in outs] == [10, 11, 12, 13, 14, 15]  # answers in request order
        assert sorted(order) == list(range(6))  # every completion reported under its own index
        seen = [{e for e in r._call("state")["events"] if e.startswith("gen")} for r in backend.replicas]
        home = {route: backend.replica_of(route) for route in ("1/1", "1/2", "1/3")}
        for first, route in ((10, "1/1"), (12, "1/1"), (15, "1/1"), (11, "1/2"), (14, "1/2"), (13, "1/3")):
            assert f"gen{first}" in seen[home[route]] and f"gen{first}" not in seen[1 - home[route]]
        assert home["1/1"] != home["1/2"]  # new routes go to the less loaded replica
        asyncio.run(backend.agenerate([routed(16, "1/1")]))  # a later turn of the group: the same replica
        assert "gen16" in backend.replicas[home["1/1"]]._call("state")["events"]

        adapter = tmp_path / "adapter"
        adapter.mkdir()
        (adapter / "adapter_config.json").write_text("{}")
        backend.load_adapter(str(adapter), 3)
        assert all(len(r._call("state")["loaded"]) == 1 and r.version == 3 for r in backend.replicas)
        assert backend.version == 3
        outs = backend.generate([routed(20, "1/1"), routed(21, "1/2")])
        assert all(o.policy_version == 3 and o.text.startswith("lora") for o in outs)
    finally:
        backend.close()


def test_rollout_gpus_named_for_a_model_that_fits_one_gpu_become_replicas_not_tensor_parallel():
    gb7 = 7.6e9 * 2 / 2**30
    plan = plan_placement([str(i) for i in range(4)], {"rollout": [0, 1, 2, 3], "learner": [0, 1, 2, 3]},
                          Memory(79.6, gb7, gb7, 0.5))
    assert plan.rollout_tp == 1 and any("4 data-parallel engines" in line for line in plan.why)
    big, quarter = 32.8e9 * 2 / 2**30, 32.8e9 * 0.55 / 2**30  # a 4-bit learner fits beside the engine's share
    plan = plan_placement([str(i) for i in range(4)], {"rollout": [0, 1, 2, 3]}, Memory(79.6, big, quarter, 0.5))
    assert plan.rollout_tp == 2 and any("2 data-parallel engines, 2 GPU(s) each" in line for line in plan.why)
    assert plan.mode == "colocated" and plan.learner == [0, 1, 2, 3]  # no GPU left: the learner shares them
    with pytest.raises(PlacementError, match="give a multiple of 2"):
        plan_placement([str(i) for i in range(4)], {"rollout": [0, 1, 2]}, Memory(79.6, big, quarter, 0.5))


# ------------------------------------------------------------------ a replica that dies
def _adapter(tmp_path, name):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    return str(folder)


@pytest.mark.slow  # worker processes killed and restarted
def test_a_replica_killed_mid_rollout_restarts_alone_with_the_latest_adapter(monkeypatch, tmp_path):
    """Two engine processes; one is killed (SIGKILL) while its requests run. They are answered by the other,
    which keeps serving; the dead one starts again on its own GPU, and takes requests only once it holds the
    adapter synced while it was down."""
    fake_machine(monkeypatch, 2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    starts: list[list[int]] = []
    gate = threading.Event()  # holds the restart until the test has synced a newer adapter

    def start(cfg, devices, **kwargs):
        starts.append(devices)
        if len(starts) > 2:
            assert gate.wait(60)
        return VLLMBackend(Tok(), {}, devices=devices, engine=ENGINE, startup_timeout_s=120, **kwargs)

    backend = _replicas(start, None, [0, 1], 1, {"log_path": str(tmp_path / "rollout.log")})
    try:
        backend.load_adapter(_adapter(tmp_path, "v1"), 1)
        requests = [routed(500, f"1/{i}") for i in range(1, 5)]  # 0.5 s each in the engine
        for i, r in enumerate(requests, 1):
            r.prompt_ids[1] = i
        victim, survivor = backend.replica_of("1/1"), backend.replica_of("1/2")
        assert victim != survivor and backend.replica_of("1/3") == victim
        dead = backend.replicas[victim]
        order: list[int] = []

        async def rollout():
            task = asyncio.ensure_future(backend.agenerate(requests, lambda i, c: order.append(i)))
            await asyncio.sleep(0.1)  # its requests are in flight (each takes 0.5 s in the engine)
            os.kill(dead._proc._proc.pid, signal.SIGKILL)
            return await task

        outs = asyncio.run(rollout())
        assert [o.token_ids for o in outs] == [[1, 500], [2, 500], [3, 500], [4, 500]]  # the step is complete
        assert sorted(order) == [0, 1, 2, 3] and all(o.policy_version == 1 for o in outs)
        events = backend.replicas[survivor]._call("state")["events"]
        assert events.count("gen500") == 4  # its own two, and the two the dead replica lost
        assert backend.state[victim] == "restarting" and backend.replica_of("1/1") == survivor  # the route moved

        backend.load_adapter(_adapter(tmp_path, "v2"), 2)  # while the dead one is down: reaches the survivor
        assert backend.replicas[survivor].version == 2 and backend.version == 2
        gate.set()
        assert backend.wait_restarts(60)
        fresh = backend.replicas[victim]
        assert fresh is not dead and backend.state[victim] == "live" and backend.restarts == 1
        assert starts == [[0], [1], [victim]]  # only the dead one started again, on its own GPU
        loaded = fresh._call("state")["loaded"]
        assert [Path(path).name for _, _, path in loaded] == ["v2"] and fresh.version == 2
        out = backend.generate([routed(30, "2/1")])[0]  # a new problem: the replica holding the fewest
        assert backend.replica_of("2/1") == victim and out.policy_version == 2 and out.text.startswith("lora")
    finally:
        backend.close()


class Replica(FakeEngine):
    """A stand-in engine that can die: then every call raises as a dead worker's does, and alive() says so.
    `die_after`: it dies during its call after that many. `bad`: it refuses every request while alive;
    `refuse`: that many generate calls."""

    concurrent = True

    def __init__(self, die_after: int | None = None) -> None:
        super().__init__()
        self.dead = self.bad = self.closed = False
        self.refuse = 0
        self.die_after = die_after
        self.routes: list[str] = []
        self.events: list[str] = []

    def alive(self):
        return not self.dead

    def _check(self, op):
        if self.dead:
            raise BackendError(f"vLLM worker process died during {op} (exit code -9)")
        if self.bad:
            raise BackendError(f"vLLM worker.{op} failed in its process: ValueError: bad request")

    async def agenerate(self, requests, on_completion=None):
        self._check("generate")
        if self.refuse:
            self.refuse -= 1
            raise BackendError("vLLM worker.generate failed in its process: RuntimeError: a passing fault")
        if self.die_after is not None and len(self.routes) >= self.die_after:
            await asyncio.sleep(0.01)
            self.dead = True
            self._check("generate")
        self.routes.extend(r.route for r in requests)
        return await super().agenerate(requests, on_completion)

    def load_adapter(self, path, version):
        self._check("load_lora")
        self.events.append(f"load v{version}")
        super().load_adapter(path, version)

    def sleep(self):
        self._check("sleep")
        self.events.append("sleep")

    def wake(self):
        self._check("wake")
        self.events.append("wake")

    def close(self):
        self.closed = True


def seeded(route: str) -> GenerationRequest:
    return GenerationRequest([1, 2], SamplingParams(max_tokens=3, seed=0), route=route)


def test_a_replica_that_fails_twice_is_taken_out_and_with_none_left_the_run_ends(caplog):
    started: list[Replica] = []
    gate = threading.Event()  # a restart takes minutes: the step goes on without it

    def start(k):
        assert gate.wait(5)
        started.append(Replica())
        return started[-1]

    a, b = Replica(), Replica()
    backend = Replicas([a, b], start=start)
    backend.load_adapter("v1", 1)
    a.dead = True
    with caplog.at_level(logging.WARNING, logger="kforge.rollout"):
        outs = backend.generate([seeded("p1"), seeded("p2"), seeded("p3")])
        assert len(outs) == 3 and b.routes == ["p1", "p2", "p3"]  # the dead one's route went to the other
        gate.set()
        assert backend.wait_restarts(5) and a.closed and backend.state == ["live", "live"]
        assert started[0].events == ["load v1"] and backend.replicas[0] is started[0]

        started[0].dead = True  # its second failure: taken out, the run goes on with the other
        assert len(backend.generate([seeded("p1"), seeded("p4")])) == 2
        assert backend.state == ["out", "live"] and len(started) == 1
    assert "taken out; 1 replica(s) left" in caplog.text

    b.bad = True  # an error of a replica that is alive is the request's: raised, nothing restarted
    with pytest.raises(BackendError, match="bad request"):
        backend.generate([seeded("p5")])
    assert backend.state == ["out", "live"] and b.closed is False
    b.bad = False

    b.dead = True  # the last replica restarts; its requests wait for it
    assert len(backend.generate([seeded("p5")])) == 1 and started[1].routes == ["p5"]
    started[1].dead = True
    with pytest.raises(NoReplicaLeft, match="none is left") as failure:
        backend.generate([seeded("p5")])
    assert backend.state == ["out", "out"] and backend.restarts == 2

    from kforge.train.trainer import Trainer  # the trainer ends the run instead of restarting the backend

    trainer = SimpleNamespace(parts=SimpleNamespace(shares_model=False, restart_backend=lambda: pytest.fail("restarted")))
    with pytest.raises(NoReplicaLeft):
        Trainer._restart_backend(trainer, failure.value, 3)
    backend.close()


def test_a_replica_found_dead_while_the_others_sleep_starts_at_wake_with_the_sync_and_a_failed_restart_is_out():
    """Asleep (colocated), the learner ranks train on the replicas' GPUs, and a vLLM start sizes itself from
    the free memory there: a replica found dead then (here by a sync) starts again only at wake, and loads
    the sync it missed."""
    fresh = Replica()
    starts = iter([fresh, RuntimeError("CUDA out of memory")])
    started = threading.Event()

    def start(k):
        started.set()
        nxt = next(starts)
        if isinstance(nxt, Exception):
            raise nxt
        return nxt

    a, b = Replica(), Replica()
    backend = Replicas([a, b], start=start)
    backend.load_adapter("v1", 1)
    backend.sleep()
    a.dead = True
    backend.load_adapter("v2", 2)  # the sync finds the dead one: it restarts, but not while they sleep
    assert not started.wait(0.5) and backend.state == ["restarting", "live"] and a.closed
    backend.wake()
    assert backend.wait_restarts(5) and backend.replicas[0] is fresh
    assert fresh.events == ["load v2"] and b.events[-2:] == ["load v2", "wake"] and backend.version == 2

    fresh.dead = True  # its restart fails: out after one restart
    outs = backend.generate([seeded("p1"), seeded("p2")])
    assert len(outs) == 2 and backend.wait_restarts(5) and backend.state == ["out", "live"]
    backend.close()
    assert b.closed


def test_a_step_whose_replica_dies_mid_rollout_is_complete_without_restarting_the_backend(tmp_path):
    from fake_parts import FakeLearner, FakePool
    from trainer_parts import make_cfg, make_trainer

    cfg = make_cfg()
    cfg.rollout.max_staleness = 0
    trainer = make_trainer(tmp_path, cfg, FakeLearner(), FakePool())
    trainer.parts.restart_backend = lambda: pytest.fail("the whole backend was restarted")
    fresh = Replica()
    backend = trainer.parts.runner.backend = Replicas([Replica(die_after=2), Replica()], start=lambda k: fresh)
    backend.load_adapter("v3", 3)
    rollouts = asyncio.run(trainer._rollouts(1, trainer.train_problems[:2]))
    assert len(rollouts.trajectories) == 8 and all(t.turns and t.turns[0].response_ids for t in rollouts.trajectories)
    assert all(t.turns[0].policy_version == 3 for t in rollouts.trajectories)
    assert backend.wait_restarts(5) and backend.restarts == 1 and trainer.restarts == 0 and fresh.version == 3
    trainer.parts.close()


def test_a_request_error_of_a_live_replica_is_retried_there_and_restarts_no_engine(tmp_path):
    """One request fails on a replica that is up: it is tried once more there, and a passing fault costs
    nothing else; a request the replica refuses again fails the step with a final error. Neither restarts
    any engine (not the whole backend: every other replica serves on; not that one: it is up)."""
    from fake_parts import FakeLearner, FakePool
    from trainer_parts import make_cfg, make_trainer

    cfg = make_cfg()
    cfg.rollout.max_staleness = 0
    trainer = make_trainer(tmp_path, cfg, FakeLearner(), FakePool())
    trainer.parts.restart_backend = lambda: pytest.fail("every engine was restarted for one request")
    flaky, other = Replica(), Replica()
    backend = trainer.parts.runner.backend = Replicas([flaky, other], start=lambda k: pytest.fail("a live replica restarted"))
    flaky.refuse = 1
    rollouts = asyncio.run(trainer._rollouts(1, trainer.train_problems[:2]))  # a problem on each replica
    assert len(rollouts.trajectories) == 8 and all(t.turns[0].response_ids for t in rollouts.trajectories)
    assert flaky.refuse == 0 and len(flaky.routes) == 4 and len(other.routes) == 4  # retried where it failed
    flaky.bad = True
    with pytest.raises(RequestFailed, match="refused a request twice.*bad request") as failure:
        asyncio.run(trainer._rollouts(2, trainer.train_problems[:2]))
    assert failure.value.final and backend.state == ["live", "live"] and backend.restarts == 0
    assert not flaky.closed and not other.closed and trainer.restarts == 0
    trainer.parts.close()


def test_colocated_a_replica_restarting_is_waited_for_before_the_learner_step(tmp_path):
    """Two GPUs, each an engine replica and a learner rank. A replica dies during the rollouts and restarts in
    the background while the step goes on; its vLLM start (which sizes the engine from the GPU's free memory)
    must not run while the learner rank on that GPU trains: the learner's step waits for the whole restart,
    and then every replica sleeps through it."""
    from fake_parts import FakePool
    from kforge.train.placement import Plan
    from kforge.train.trainer import StepTimes
    from trainer_parts import Serial, make_cfg, make_trainer, one_sample

    gate, spans, fresh = threading.Event(), [], Replica()

    def start(k):
        assert gate.wait(10)  # held until the rollouts are done: the restart outlasts them
        t0 = time.monotonic()
        time.sleep(0.3)  # vLLM starting on the GPU
        spans.append((t0, time.monotonic()))
        return fresh

    cfg = make_cfg()
    cfg.rollout.max_staleness = 0
    learner = Serial(step_s=0.3)
    trainer = make_trainer(tmp_path, cfg, learner, FakePool())
    trainer.plan = Plan(["0", "1"], rollout=[0, 1], learner=[0, 1], eval=[0, 1])
    assert trainer.plan.mode == "colocated"
    backend = trainer.parts.runner.backend = Replicas([Replica(die_after=2), Replica()], start=start)
    backend.load_adapter("v3", 3)

    async def main():
        rollouts = await trainer._rollouts(1, trainer.train_problems[:2])
        assert backend.state[0] == "restarting"  # the step goes on while it starts
        gate.set()
        await trainer._learn_step(one_sample(), StepTimes())
        return rollouts

    assert len(asyncio.run(main()).trajectories) == 8
    ((_, start1),), ((train0, _),) = spans, learner.spans  # one span each
    assert start1 <= train0  # the restart was over before the learner's step began
    assert backend.state == ["live", "live"] and fresh.events == ["load v3", "sleep", "wake"]
    trainer.parts.close()
