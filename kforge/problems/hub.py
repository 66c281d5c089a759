"""Problems whose reference downloads models from the Hugging Face hub (KernelBench level 4).

Such a problem runs only when the hub can be reached or its models are already in the local Hugging Face
cache. `hub_blocker` says, before anything is started, why one cannot run here, so callers give a clear
verdict ("needs the hub") instead of a reference that crashes inside a sandbox without network.
"""

from __future__ import annotations

import os
import socket
import sys
from functools import lru_cache
from typing import Sequence
from urllib.parse import urlparse

from kforge.problems.record import Problem

_OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


@lru_cache(maxsize=1)
def hub_unreachable() -> str | None:
    """Why the hub cannot be reached from this machine, or None when it can (asked once per process)."""
    for var in _OFFLINE_VARS:
        if os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on"):
            return f"{var}={os.environ[var]} is set"
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    host = urlparse(endpoint).hostname or "huggingface.co"
    try:
        with socket.create_connection((host, 443), timeout=3):
            return None
    except OSError as exc:
        return f"{host} cannot be reached ({type(exc).__name__})"


def offline_unless_reachable() -> str | None:
    """Ask the hub once; when it cannot be reached, this process and the ones it starts read the local cache
    only, instead of retrying the hub (with a warning per try) before every cached file. Returns why it
    went offline: None when the hub answers or the environment already said so."""
    if any(os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on") for var in _OFFLINE_VARS):
        return None
    reason = hub_unreachable()
    if reason is not None:
        os.environ["HF_HUB_OFFLINE"] = "1"
        constants = sys.modules.get("huggingface_hub.constants")
        if constants is not None:  # imported already: it read the variable at import
            constants.HF_HUB_OFFLINE = True
    return reason


def model_cached(model: str) -> bool:
    """Whether `model`'s config is in the local Hugging Face cache (then it loads offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    found = try_to_load_from_cache(model, "config.json")
    return isinstance(found, str)


def hub_blocker(problem: Problem) -> str | None:
    """One line saying why `problem` cannot run on this machine, or None when it can."""
    missing = [m for m in problem.hub_models if not model_cached(m)]
    if not missing:
        return None
    reason = hub_unreachable()
    if reason is None:
        return None
    return (
        f"{problem.key} ({problem.name}) downloads {', '.join(missing)} from the Hugging Face hub and {reason}: "
        "run it once with network access so the models are cached, or leave level 4 out"
    )


def split_runnable(problems: Sequence[Problem]) -> tuple[list[Problem], list[tuple[Problem, str]]]:
    """(problems that can run here, [(problem, why not)]) without starting any of them."""
    runnable: list[Problem] = []
    blocked: list[tuple[Problem, str]] = []
    for p in problems:
        why = hub_blocker(p)
        if why is None:
            runnable.append(p)
        else:
            blocked.append((p, why))
    return runnable, blocked
