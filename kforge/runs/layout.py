"""The names at the top of a run folder: each file and folder a run writes, and whether a name is one of them
(a folder holding anything else is never reused or deleted by kforge)."""

from __future__ import annotations

import re

from kforge.runs.checkpoints import CHECKPOINTS_DIR

STATUS_FILE = "status.json"
# Its status while the run's process lives (one whose process is gone reads "crashed"), and once it ended unfinished.
LIVE = ("starting", "running", "stopping")
ENDED = ("failed", "crashed", "stopped", "killed")
CONFIG_FILE = "config.yaml"
CONFIG_HISTORY_FILE = "config_history.jsonl"  # what each resume changed in config.yaml, and by which layer
METRICS_FILE = "metrics.jsonl"
CHECKPOINTS_FILE = "checkpoints.jsonl"
LOG_FILE = "logs.log"
STOP_FILE = "STOP"  # `kforge runs stop` drops this; the loop checkpoints and exits at the next step
ADAPTERS_DIR = "adapters"  # adapter versions handed to the rollout engine where /dev/shm has no room (last few kept)
SAMPLES_DIR = "samples"  # per-step transcripts, samples/step_N.jsonl
# Every name kforge writes at the top of a run folder (the roles' logs, the metric writers' and the plots'
# outputs too; W&B's own files go into wandb/, as wandb.init(dir=the run folder) makes it): a folder holding
# anything else is never reused.
RUN_ENTRIES = frozenset({STATUS_FILE, CONFIG_FILE, CONFIG_HISTORY_FILE, METRICS_FILE, CHECKPOINTS_FILE, LOG_FILE, STOP_FILE,
                         CHECKPOINTS_DIR, ADAPTERS_DIR, SAMPLES_DIR, "learner.log", "rollout.log", "tensorboard",
                         "wandb", "wandb_id", "reward.png", "correctness.png", "speedup.png"})
# The logs of learner ranks after the first and of rollout engine replicas after the first.
ROLE_LOG = re.compile(r"(learner\.rank|rollout\.replica)[1-9][0-9]*\.log")


def written_by_run(name: str) -> bool:
    """A top-level name a run writes: one of RUN_ENTRIES, a role's log, a torn-line copy, or an atomic write's temp."""
    if name.startswith(".") and ".tmp" in name:
        name = name[1:name.index(".tmp")]
    return bool(ROLE_LOG.fullmatch(name)) or name in RUN_ENTRIES or (name.endswith(".torn") and name[:-5] in RUN_ENTRIES)
