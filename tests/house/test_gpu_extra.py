"""The `gpu` extra installs the vLLM / torch pairing the README names and kforge was tested with, not
whatever vLLM is newest (which brings a torch of its own)."""

import re

import pytest
from packaging.requirements import Requirement

from locations import REPO


def test_gpu_extra_pins_the_tested_vllm_and_torch():
    tomllib = pytest.importorskip("tomllib")
    extra = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    reqs = {r.name: r.specifier for r in map(Requirement, extra)}
    vllm, torch = re.search(r"vLLM (\d+\.\d+) pins torch (\d+\.\d+)", (REPO / "README.md").read_text()).groups()
    assert reqs["vllm"].contains(f"{vllm}.0") and reqs["vllm"].contains(f"{vllm}.9")
    assert reqs["torch"].contains(f"{torch}.0") and reqs["torch"].contains(f"{torch}.1")
    for newer in ("0.24.0", "0.33.0", "1.0.0"):
        assert not reqs["vllm"].contains(newer), newer
    for newer in ("2.12.0", "2.14.0"):
        assert not reqs["torch"].contains(newer), newer
