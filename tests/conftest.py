import os
from pathlib import Path

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
SHARED = REPO.parent / "shared"
KERNELBENCH_JSONL = SHARED / "data" / "kernelbench" / "problems.jsonl"


@pytest.fixture
def clean_env(monkeypatch):
    """No KFORGE_* variables from the calling shell leak into config tests."""
    for key in list(os.environ):
        if key.startswith("KFORGE_"):
            monkeypatch.delenv(key)
    return monkeypatch
