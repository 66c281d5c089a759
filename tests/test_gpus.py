"""The one logical -> physical GPU mapping (kforge.gpus) and placement errors, on a pretend machine."""

from __future__ import annotations

import pytest

import kforge.gpus as gpus
from fake_parts import fake_machine, fake_served
from kforge.train.placement import plan_placement


def test_logical_to_physical_follows_cuda_visible_devices(monkeypatch):
    fake_machine(monkeypatch, 4)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert gpus.visible_ids() == ["0", "1", "2", "3"] and gpus.physical_id(3) == "3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert gpus.physical_id(0) == "2" and gpus.gpu_name(0) == "NVIDIA H100 #2"
    assert gpus.child_visible_devices([1, 0]) == "0,2"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-3a,1")  # UUID prefixes name GPUs too
    assert gpus.visible_ids() == ["GPU-3a", "1"] and gpus.gpu_name(0) == "NVIDIA H100 #3"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,-1,3")  # CUDA stops at the first invalid entry
    assert gpus.visible_ids() == ["1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7,1")  # a GPU that does not exist ends the list as well
    assert gpus.visible_ids() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-5a3c-11")  # MIG instances pass through unchanged
    assert gpus.physical_id(0) == "MIG-5a3c-11"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert gpus.visible_ids() == []
    with pytest.raises(gpus.GpuIndexError, match="GPU 0 does not exist: no GPU is visible"):
        gpus.physical_id(0)


def test_no_gpu_machine_sees_none_whatever_the_variable_says(monkeypatch):
    fake_machine(monkeypatch, 0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpus.visible_ids() == []


def test_placement_rejects_gpus_that_are_not_visible(monkeypatch):
    fake_machine(monkeypatch, 0)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert plan_placement().mode == "cpu"
    with pytest.raises(gpus.GpuIndexError, match="learner GPU 1 does not exist: no GPU is visible"):
        plan_placement(None, {"learner": [1]})  # on a CPU machine this used to be ignored
    fake_machine(monkeypatch, 2)
    with pytest.raises(gpus.GpuIndexError, match="eval GPU 2 does not exist: 2 GPU"):
        plan_placement(None, {"eval": [2]})
    plan = plan_placement(None, {"eval": [0]})
    assert (plan.mode, plan.rollout, plan.learner, plan.eval) == ("colocated", [0, 1], [0, 1], [0])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    plan = plan_placement(None, {"rollout": [0]})
    assert (plan.rollout, plan.learner, plan.names("rollout")) == ([0], [1], "0 (1)")  # logical, for every role


def test_every_role_maps_logical_indices_through_one_function(monkeypatch):
    """The learner process gets logical indices like the rollout worker and the eval pool, and its child's
    CUDA_VISIBLE_DEVICES is the physical id of that index (it used to be handed a physical id string)."""
    import inspect

    from kforge.train import learner_proc

    fake_machine(monkeypatch, 4)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    started = []
    monkeypatch.setattr(learner_proc, "ServedProcess", fake_served(started))
    from kforge.config.schema import KforgeConfig
    from kforge.rollout.base import SamplingParams

    learner_proc.LearnerProcess(KforgeConfig(), [1], sampling=SamplingParams())
    assert [(s["env"], s["kwargs"]["device"]) for s in started] == [({"CUDA_VISIBLE_DEVICES": "1"}, "cuda")]
    started.clear()  # two ranks (a colocated plan on two GPUs): each rank sees its own GPU only
    learner_proc.LearnerProcess(KforgeConfig(), [0, 1], sampling=SamplingParams())
    assert {s["name"]: s["env"]["CUDA_VISIBLE_DEVICES"] for s in started} == {"learner": "3", "learner rank 1": "1"}
    with pytest.raises(gpus.GpuIndexError, match="GPU 2 does not exist: 2 GPU"):
        learner_proc.LearnerProcess(KforgeConfig(), [2], sampling=SamplingParams())
    assert list(inspect.signature(learner_proc.LearnerProcess).parameters)[1] == "devices"


def test_kforge_check_finds_its_gpu_through_the_driver_not_cuda(monkeypatch):
    """`kforge check` asks `kforge.gpus` (nvidia-smi/NVML) which GPU to use; it used to initialise CUDA in the
    CLI process with torch.cuda.is_available()."""
    import torch

    from kforge.cli import check

    def no_cuda():
        raise AssertionError("the CLI process must not initialise CUDA")

    monkeypatch.setattr(torch.cuda, "is_available", no_cuda)
    fake_machine(monkeypatch, 2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert check._devices(cpu=False) == [0] and check._devices(cpu=True) == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert check._devices(cpu=False) == []


def test_one_check_of_gpu_indices_words_every_error_alike():
    with pytest.raises(gpus.GpuIndexError, match=r"^--gpu 3 does not exist: 2 GPU\(s\) visible \(0..1\)$"):
        gpus.check_indices([0, 3], 2, "--gpu")
    with pytest.raises(gpus.GpuIndexError, match="^eval GPU -1 does not exist: no GPU is visible$"):
        gpus.check_indices([-1], 0, "eval GPU")
    gpus.check_indices([0, 1], 2)


def test_train_gpus_option_naming_an_invisible_gpu_is_one_line_and_exit_2(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kforge", "train", "--preset", "tiny", "--runs-dir", str(tmp_path),
                          "--gpus", "learner=1", "--plain"], capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    assert out.returncode == 2, out.stdout + out.stderr
    assert "learner GPU 1 does not exist" in out.stdout + out.stderr and "Traceback" not in out.stderr
