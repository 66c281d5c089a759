"""The vLLM backend's worker process and pipe protocol, and (where vLLM imports and a GPU is present) the
real engine.

This machine has no GPU and no vLLM, so the protocol tests run the real worker process (spawn, the
environment it starts with, the pipe, concurrent requests, error and crash handling, adapter ids,
prefix-cache resets) with `RecordingEngine` (tests/support/recording_engine.py) standing in for vLLM's async engine
inside it: the one piece this machine lacks.
The engine tests at the end are skipped unless vLLM imports and CUDA is available.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from fake_parts import FakeEngine, fake_machine
from kforge.rollout.base import BackendError, GenerationRequest, SamplingParams
from kforge.rollout.vllm_worker import VLLMBackend, lora_rank_for, sampled_logprobs_of
from recording_engine import ENGINE, Tok, req


@pytest.fixture(scope="module")
def worker():
    backend = VLLMBackend(Tok(), {"model": "scratch", "seed": 5}, devices=None, engine=ENGINE, startup_timeout_s=120)
    yield backend
    backend.close()


def test_visible_devices_mapping(monkeypatch):
    from kforge.rollout.vllm_worker import child_env

    fake_machine(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    assert child_env([1, 2])["CUDA_VISIBLE_DEVICES"] == "5,6"
    assert "CUDA_VISIBLE_DEVICES" not in child_env(None)  # the child inherits the parent's view
    with pytest.raises(BackendError, match="GPU 3 does not exist"):
        child_env([3])


def test_lora_rank_rounds_up_to_an_allowed_rank():
    assert lora_rank_for(8) == 8 and lora_rank_for(12) == 16 and lora_rank_for(32) == 32
    with pytest.raises(BackendError):
        lora_rank_for(100000)


def test_sampled_logprobs_are_read_from_the_sampled_token_entries():
    class Logprob:
        def __init__(self, v):
            self.logprob = v

    entries = [{5: Logprob(-0.5)}, {7: Logprob(-1.5), 2: Logprob(-0.1)}]
    assert sampled_logprobs_of([5, 7], entries) == [-0.5, -1.5]
    with pytest.raises(BackendError):
        sampled_logprobs_of([5], None)


def test_generate_round_trip_keeps_request_order(worker):
    outs = worker.generate([req([1, 2, 3, 4]), req([9, 8], max_tokens=5), req([7], temperature=0.0, stop=["x"])])
    assert [o.token_ids for o in outs] == [[4, 3, 2], [8, 9], [7]]
    assert [o.finish_reason for o in outs] == ["length", "stop", "stop"]
    assert outs[0].text == "base:[4, 3, 2]" and outs[0].logprobs == [-0.25] * 3
    assert all(o.policy_version == 0 for o in outs)
    state = worker._call("state")
    assert state["kwargs"] == {"model": "scratch", "seed": 5}
    assert worker.generate([]) == []


def test_requests_are_taken_one_by_one_not_as_a_batch(worker):
    """A slow request does not hold back the others: each is its own call into the async engine."""
    done: list[int] = []

    async def main():
        return await worker.agenerate([req([500, 1]), req([2, 3]), req([4, 5])], lambda i, c: done.append(i))

    t0 = time.perf_counter()
    outs = asyncio.run(main())
    assert done[-1] == 0 and sorted(done) == [0, 1, 2]  # the slow one finished last
    assert [o.token_ids for o in outs] == [[1, 500], [3, 2], [5, 4]]  # results still in request order
    assert time.perf_counter() - t0 < 3.0


def test_worker_environment_is_set_before_it_starts(monkeypatch):
    fake_machine(monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6")
    backend = VLLMBackend(Tok(), {}, devices=[2], engine=ENGINE, startup_timeout_s=120)
    try:
        env = backend._call("state")["env"]
        assert env["CUDA_VISIBLE_DEVICES"] == "6" and backend.info["cuda_visible_devices"] == "6"
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6"  # the parent's own view is untouched
    finally:
        backend.close()
    assert not backend._proc.alive()


def test_from_config_resolves_the_model_once_for_the_tokenizer_and_the_engine(monkeypatch):
    import kforge.modelio as modelio
    from kforge.config.schema import KforgeConfig

    resolved = []
    monkeypatch.setattr(modelio, "resolve_model",
                        lambda name, gguf_file=None, dense=True: resolved.append(name) or modelio.ModelRef("/m/dense"))
    monkeypatch.setattr(modelio, "load_tokenizer", lambda ref, *_a: ("tokenizer of", ref.path))
    cfg = KforgeConfig()
    backend = VLLMBackend.from_config(cfg, engine=ENGINE, startup_timeout_s=120)
    try:
        kwargs = backend._call("state")["kwargs"]
        assert resolved == [cfg.model.name] and backend.tokenizer == ("tokenizer of", "/m/dense")
        assert kwargs["model"] == kwargs["tokenizer"] == "/m/dense"
    finally:
        backend.close()


def test_replicas_share_one_resolved_model(monkeypatch):
    import kforge.modelio as modelio
    import kforge.rollout.factory as factory
    from kforge.config.schema import KforgeConfig

    resolved, started = [], []
    monkeypatch.setattr(modelio, "resolve_model",
                        lambda name, gguf_file=None, dense=True: resolved.append(name) or modelio.ModelRef("/m/dense"))
    monkeypatch.setattr(factory, "choose_backend", lambda _requested: "vllm")
    monkeypatch.setattr(VLLMBackend, "from_config",
                        lambda cfg, devices, ref=None, **kw: started.append((devices, ref)) or FakeEngine())
    factory.make_backend(KforgeConfig(), [0, 1, 2], tensor_parallel=1)
    assert len(resolved) == 1 and sorted(d for d, _ in started) == [[0], [1], [2]]
    assert {ref.path for _, ref in started} == {"/m/dense"}


def test_adapter_ids_are_never_reused_and_a_sync_resets_no_prefix_cache(worker, tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    worker.load_adapter(str(adapter), 1)
    first = worker.generate([req([1, 2])])[0].text
    worker.load_adapter(str(adapter), 2)
    worker.load_adapter(str(adapter), 2)  # the same version again still gets a fresh id
    last = worker.generate([req([1, 2])])[0].text
    state = worker._call("state")
    ids = [lora[1] for lora in state["loaded"]]
    assert ids == [1, 2, 3] and len(set(ids)) == 3
    assert first == "lora1:[2, 1]" and last == "lora3:[2, 1]" and worker.version == 2
    events = [e for e in state["events"] if not e.startswith("gen")]
    # No prefix-cache reset on a sync: vLLM keys cached blocks by the adapter, and every load's is new.
    assert events == ["load1", "load2", "remove1", "load3", "remove2"]
    with pytest.raises(BackendError, match="adapter_config.json"):
        worker.load_adapter(str(tmp_path), 4)


def test_each_part_of_an_adapter_load_is_timed(worker, tmp_path):
    adapter = tmp_path / "slow-load"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    worker.load_adapter(str(adapter), 7)
    times = worker.load_times
    assert set(times) == {"sync_engine_load_s", "sync_remove_s"}
    assert 0.4 <= times["sync_engine_load_s"] < 5.0  # the engine's own load, not the calls around it
    assert times["sync_remove_s"] < 0.4


def test_a_replaced_adapter_is_removed_only_after_its_last_request(worker, tmp_path):
    """Pipelined steps sync while the next step's rollouts run: the adapter they were sampled with stays in the
    engine until the last of them finished (it used to be removed at once, under requests that named it)."""
    adapter = tmp_path / "inflight"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    worker.load_adapter(str(adapter), 20)
    old = worker._lora[1]

    async def main():
        slow = asyncio.ensure_future(worker.agenerate([req([500, 1]), req([2, 3])]))
        await asyncio.sleep(0.2)  # both requests are in the engine; the fast one has finished
        await asyncio.to_thread(worker.load_adapter, str(adapter), 21)
        during = worker._call("state")
        outs = await slow
        return during, outs

    during, outs = asyncio.run(main())
    assert worker._lora[1] != old and old not in during["removed"]  # replaced, but a request still held it
    assert all(o.text.startswith(f"lora{old}:") and o.policy_version == 20 for o in outs)
    events = worker._call("state")["events"]
    assert events.index(f"remove{old}") > events.index("gen500")  # removed once its last request was done
    assert worker._leases.in_flight(old) == 0
    worker.load_adapter(str(adapter), 22)  # nothing in flight: the replaced one goes at once
    assert worker._lora[1] - 1 in worker._call("state")["removed"]


def test_adapter_leases_count_requests_per_id():
    from kforge.rollout.adapters import AdapterLeases

    leases = AdapterLeases()
    leases.acquire(1)
    leases.acquire(1)
    assert not leases.retire(1) and not leases.release(1) and leases.release(1)  # the last one removes it
    assert leases.retire(2)  # never used: removed at once
    leases.acquire(3)
    assert not leases.release(3)  # the current adapter is never removed by its requests
    with pytest.raises(RuntimeError):
        leases.release(3)


def test_sleep_wake_and_engine_errors_come_back_as_backend_errors(worker, tmp_path):
    worker.sleep()
    with pytest.raises(BackendError, match="generate while asleep"):
        worker.generate([req([1])])
    adapter = tmp_path / "asleep"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    loaded_before = len(worker._call("state")["loaded"])
    worker.load_adapter(str(adapter), 9)  # waits for wake: loading needs the engine's memory
    assert len(worker._call("state")["loaded"]) == loaded_before
    worker.wake()
    state = worker._call("state")
    assert len(state["loaded"]) == loaded_before + 1 and state["loaded"][-1][2] == str(adapter.resolve())
    assert worker.version == 9
    assert worker.generate([req([3])])[0].token_ids == [3]


@pytest.mark.slow  # a worker process of its own
def test_engine_start_failure_is_reported():
    with pytest.raises(BackendError, match="no GPU memory left"):
        VLLMBackend(Tok(), {"fail": True}, engine=ENGINE, startup_timeout_s=120)


def test_worker_crash_is_reported_not_hung():
    backend = VLLMBackend(Tok(), {}, engine=ENGINE, startup_timeout_s=120)
    try:
        with pytest.raises(BackendError, match="died during generate"):
            backend.generate([req([666])])
    finally:
        backend.close()


@pytest.mark.slow  # a worker process of its own
def test_an_engine_dead_behind_a_live_worker_counts_as_dead():
    """vLLM's engine core can die while the worker process lives on: every request then fails with
    EngineDeadError. The worker must count as dead, so that it is restarted (a replica alone), not taken for
    a live engine refusing one request (which restarts nothing)."""
    backend = VLLMBackend(Tok(), {}, engine=ENGINE, startup_timeout_s=120)
    try:
        assert backend.generate([req([3])])[0].token_ids == [3] and backend.alive()
        with pytest.raises(BackendError, match="EngineDeadError"):
            backend.generate([req([667])])
        assert not backend.alive() and backend._proc.alive()
    finally:
        backend.close()


# ------------------------------------------------------------------------------- the real engine (GPU)
def _vllm_and_gpu() -> bool:
    try:
        import torch
        import vllm  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _vllm_and_gpu(), reason="needs vLLM and a CUDA GPU")
def test_real_vllm_generates_with_logprobs(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.scratch_model import write_model_folder
    from kforge.rollout.logprobs import sampled_logprobs

    folder = write_model_folder(tmp_path / "model", hidden=256, layers=2, heads=4, kv_heads=4, intermediate=512,
                                vocab_size=4000, real_weights=True, dtype="float32")
    tok = AutoTokenizer.from_pretrained(str(folder))
    backend = VLLMBackend(tok, dict(model=str(folder), dtype="bfloat16", gpu_memory_utilization=0.3, enforce_eager=True,
                                    enable_lora=True, max_lora_rank=16, max_model_len=1024,
                                    logprobs_mode="processed_logprobs"))
    try:
        prompt = tok("def add(a, b):\n", add_special_tokens=False)["input_ids"]
        (out,) = backend.generate([GenerationRequest(prompt, SamplingParams(max_tokens=16, temperature=0.8, seed=0))])
        assert len(out.token_ids) == len(out.logprobs) > 0
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).cuda()
        with torch.no_grad():
            logits = model(torch.tensor([prompt + out.token_ids]).cuda()).logits[0, len(prompt) - 1 : -1]
        expected = sampled_logprobs(logits.cpu(), torch.tensor(out.token_ids), 0.8)
        # A bf16 engine against an fp32 forward pass of the same weights.
        assert torch.allclose(torch.tensor(out.logprobs), expected, atol=0.1)
    finally:
        backend.close()
