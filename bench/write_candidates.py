"""Write the correct Triton kernels of bench/eval_throughput.py as a `kforge eval --candidates` JSONL file."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from eval_throughput import correct_candidates  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.out, "w") as fh:
        for pid, code in sorted(correct_candidates().items()):
            fh.write(json.dumps({"problem": f"1/{pid}", "code": code}) + "\n")
    print(f"wrote {len(correct_candidates())} candidates to {args.out}")


if __name__ == "__main__":
    main()
