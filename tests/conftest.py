import os
import sys

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# The `kforge` processes a test starts write to a pipe, as in a script, and decide their width from that alone:
# a terminal size exported by whatever runs the tests (pytest-xdist's workers export 80 x 24) would make them
# draw for that terminal. A test that wants a width passes COLUMNS itself.
for _size in ("COLUMNS", "LINES"):
    os.environ.pop(_size, None)


@pytest.fixture
def clean_env(monkeypatch):
    """No KFORGE_* variables from the calling shell leak into config tests."""
    for key in list(os.environ):
        if key.startswith("KFORGE_"):
            monkeypatch.delenv(key)
    return monkeypatch


@pytest.fixture(autouse=True)
def _engine_copies_in_the_tests_folder(tmp_path_factory, monkeypatch):
    """A run's adapter copies for the engine go to /dev/shm when it is there: in tests, to a folder of their
    own standing in for it, so no test writes to the machine's /dev/shm."""
    import kforge.rollout.adapters as adapters

    monkeypatch.setattr(adapters, "SHM", tmp_path_factory.mktemp("shm"))


@pytest.fixture(autouse=True)
def _wandb_stand_ins_stay_in_their_test():
    """Tests put a stand-in `wandb` module at the edge (the package is not installed here): whatever a test
    imported under that name leaves sys.modules with it, so the next test imports its own."""
    before = sys.modules.get("wandb")
    yield
    if sys.modules.get("wandb") is not before:
        if before is None:
            sys.modules.pop("wandb", None)
        else:
            sys.modules["wandb"] = before
