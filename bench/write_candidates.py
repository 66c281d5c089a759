"""Write the correct Triton kernels of bench/kb_candidates.py as a `kforge eval --candidates` JSONL file.

    python -m bench.write_candidates --out /tmp/cands.jsonl
"""

from __future__ import annotations

import argparse
import json

from bench.kb_candidates import correct_candidates


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.write_candidates", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    with open(args.out, "w") as fh:
        for pid, code in sorted(correct_candidates().items()):
            fh.write(json.dumps({"problem": f"1/{pid}", "code": code}) + "\n")
    print(f"wrote {len(correct_candidates())} candidates to {args.out}")


if __name__ == "__main__":
    main()
