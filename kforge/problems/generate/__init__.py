"""`kforge problems generate`: seeded, verifiable curricula of small problems a small model can climb.

The one family, `elementwise`, draws random torch expressions over 1-3 inputs (with an optional row
reduction at the root); each problem's solution is one Triton kernel computing the same expression, and
its held-out problems are expression structures never seen in training. Written as a problem source
(problems.jsonl, each row's split on it), `kforge sft` pairs of the train split and a manifest.
"""

from kforge.problems.generate.family import Curriculum, GenerateError, Knobs, build, check_knobs, draw
from kforge.problems.generate.folder import MANIFEST, read_manifest, write

__all__ = ["Curriculum", "GenerateError", "Knobs", "MANIFEST", "build", "check_knobs", "draw", "read_manifest", "write"]
