"""kforge's GPU checks and benchmarks, each a module run from the repository root as `python -m bench.NAME`
(see bench/common.py for what several share, and bench/device/README.md for the offline GPU kit)."""
