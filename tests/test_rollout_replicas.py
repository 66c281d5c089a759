"""Data-parallel rollout: one engine per GPU group behind a router that keeps a problem's requests on one
replica, with adapter syncs sent to every replica. The engines are real worker processes with vLLM's async
engine stood in (`RecordingEngine`, as in test_rollout_vllm: this machine has no vLLM and no GPU)."""

from __future__ import annotations

import asyncio

import pytest
from fake_parts import fake_machine
from test_rollout_vllm import ENGINE, _Tok, req

from kforge.rollout.base import GenerationRequest
from kforge.rollout.factory import _replicas
from kforge.rollout.vllm_worker import VLLMBackend
from kforge.train.placement import Memory, PlacementError, plan_placement


def routed(first: int, route: str) -> GenerationRequest:
    r = req([first, 7])
    return GenerationRequest(r.prompt_ids, r.sampling, route=route)


def test_one_engine_per_gpu_group_a_route_stays_on_its_replica_and_syncs_reach_all(monkeypatch, tmp_path):
    fake_machine(monkeypatch, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)

    def start(cfg, devices, **kwargs):
        return VLLMBackend(_Tok(), {}, devices=devices, engine=ENGINE, startup_timeout_s=120, **kwargs)

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
    big = 32.8e9 * 2 / 2**30
    plan = plan_placement([str(i) for i in range(4)], {"rollout": [0, 1, 2, 3]}, Memory(79.6, big, big, 0.5))
    assert plan.rollout_tp == 2 and any("2 data-parallel engines, 2 GPU(s) each" in line for line in plan.why)
    with pytest.raises(PlacementError, match="give a multiple of 2"):
        plan_placement([str(i) for i in range(4)], {"rollout": [0, 1, 2]}, Memory(79.6, big, big, 0.5))
