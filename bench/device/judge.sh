#!/usr/bin/env bash
# The judge on a GPU, one section after another (each log in $OUT): the candidate and attack corpus,
# throughput on KernelBench level 1 at full size (cold, then with the reference cache warm), and the
# reference baselines of level 1. Run from the repo root after bench/device/prepare.sh.
#   bash bench/device/judge.sh [BASELINE_SECONDS]
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
KB=.evalcarry/problems.jsonl
BASE=.evalcarry/H100_Modal__baseline_time_torch.json
run() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
}
run throughput_cold "${1:-200}" python3 bench/eval_throughput.py --problems $KB --baselines $BASE --big --cache-dir /tmp/kc-tp
run corpus "${2:-240}" python3 bench/gpu_evaluator_corpus.py --skip-cuda --cache-dir /tmp/kc-corpus
[ "${3:-0}" -gt 0 ] && run baseline_l1 "$3" python3 -m kforge problems baseline --level 1 --source $KB --out "$OUT/baseline_l1.json"
tail -n 30 "$OUT"/*.log | cut -c1-250
