#!/usr/bin/env bash
# The judge on a GPU, one section per argument (each log in $OUT/<section>.log, one line per section in
# $OUT/summary.txt). Run from the repo root after bench/device/prepare.sh; KernelBench's problems and
# baselines are read from .evalcarry/ (carried into the GPU machine).
#   bash bench/device/judge.sh corpus             # attack corpus + coverage: ~6-9 min on an H100, one call alone
#   bash bench/device/judge.sh full6              # 6 full-size level-1 kernels: ~1 min
#   bash bench/device/judge.sh corpus full6 ab6 throughput baseline
# Sections:
#   corpus      every candidate and attack of tests/candidates in every layer mode, and GPU-time coverage
#               (honest, lazy, decoy, a kernel named `v`, the profiled-call dodge, a CUDA load_inline kernel),
#               then the replay pair in order (replay_publish.py, replay.py: rows "replay/...")
#   full6       6 level-1 kernels at full KernelBench size (ReLU, LeakyReLU, Sigmoid, Softmax: 6.4 GB in and
#               out; Sum over a dimension: 2.1 GB in; Matrix-vector: 8.6 GB in) plus a copy posing as ReLU
#   ab6         the same 6, this checkout against the one in .evalcarry/base, interleaved (before/after)
#   throughput  all level-1 candidates of bench/eval_throughput.py, cold then warm
#   baseline    `kforge problems baseline` over level 1 (time limit: BASELINE_S, default 300)
#   reuse       the throughput candidates twice in one pool (the second round: every reference cached), with one
#               draw of inputs for all evaluations (inputs_reuse 1000000) and with fresh inputs for each (1)
#   repeat      bench/repeatability.py: 8 big-input kernels (Triton and CUDA), 3 `kforge check`s each and a pool run
#   only        the corpus rows of the files in ONLY (e.g. ONLY=skewed_timing.py): a second look at one case
#   latency     bench/judge_latency.py: small kernels one at a time (the breakdown) and 16 workers (checks/min),
#               the checkout in .evalcarry/base (before) and this one (after), one after the other
#               (SIDES=this: only this checkout)
#   load        the honest small kernels, KernelBench candidates and built-in solutions judged 3 times beside
#               a busy pool and a CPU spinner (flags counted)
#   startups    16 workers with evaluator.startups_per_gpu 0 (no limit), 2, 4, then 0 again (STARTUPS=...)
#   loadattacks the corpus rows of ATTACKS (default: the deferral attacks and round 5's holes) judged while a
#               busy pool and a CPU spinner run beside them
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=${SITE:-/tmp/site}:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1  # SITE: where the wheels are
KB=.evalcarry/problems.jsonl
BASE=.evalcarry/H100_Modal__baseline_time_torch.json
export KFORGE_KERNELBENCH=$PWD/$KB  # the benches' KernelBench problems (judge_latency's --set kb)
FULL6=19,20,21,23,47,4
ROUND5=skip_timed_calls.py,skip_unchecked_call.py,copy_then_clamp.py,copy_then_log_softmax.py,zeros_then_einsum.py,\
decoy_canary.py,compile_after_zeros.py,thread_before_lockdown.py,native_build_thread.py,host_text_forged.py,torch_then_copy.py
run() {  # name, seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  echo "$name rc=$? $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
}
for s in "$@"; do
  case "$s" in
    corpus) run corpus 540 python3 -m bench.gpu_evaluator_corpus --cache-dir /tmp/kc-corpus
            grep -E "MISMATCH|as expected|coverage/|replay/" "$OUT/corpus.log" | cut -c1-220 ;;
    full6) run full6 230 python3 -m bench.eval_throughput --problems $KB --baselines $BASE --big --only $FULL6 \
             --timing-trials 100 --cache-dir /tmp/kc-full6
           tail -n 20 "$OUT/full6.log" | cut -c1-250 ;;
    ab6) [ -d .evalcarry/base/kforge ] || { echo "ab6 needs .evalcarry/base (git archive f4782c0)"; continue; }
         run ab6 570 python3 -m bench.eval_ab --base-dir .evalcarry/base --rounds 1 --problems $KB -- \
           --baselines $BASE --big --only $FULL6 --timing-trials 100
         tail -n 8 "$OUT/ab6.log" ;;
    throughput) run throughput 400 python3 -m bench.eval_throughput --problems $KB --baselines $BASE --big \
                  --cache-dir /tmp/kc-tp
                tail -n 12 "$OUT/throughput.log" | cut -c1-250 ;;
    baseline) run baseline_l1 "${BASELINE_S:-300}" python3 -m kforge problems baseline --level 1 --source $KB \
                --out "$OUT/baseline_l1.json"
              tail -n 5 "$OUT/baseline_l1.log" ;;
    reuse) for n in 1000000 1; do
             run "reuse_$n" 590 python3 -m bench.eval_throughput --problems $KB --baselines $BASE --big --repeat 2 \
               --inputs-reuse $n --cache-dir "/tmp/kc-reuse-$n"
             tail -n 12 "$OUT/reuse_$n.log" | cut -c1-250
           done ;;
    repeat) run repeat 1500 python3 -m bench.repeatability --problems $KB --checks 3 --cache-dir /tmp/kc-repeat
            tail -n 16 "$OUT/repeat.log" | cut -c1-250 ;;
    only) run only 300 python3 -m bench.gpu_evaluator_corpus --only "${ONLY:?ONLY=file.py}" --cache-dir /tmp/kc-only
          grep -E "MISMATCH|as expected|attacks/" "$OUT/only.log" | cut -c1-220 ;;
    latency) for side in ${SIDES:-base this}; do
               root=$PWD; [ "$side" = base ] && root=$PWD/.evalcarry/base
               [ -d "$root/kforge" ] || { echo "latency needs .evalcarry/base (git archive of the before)"; continue; }
               KFORGE_BENCH_ROOT=$root run "latency_1_$side" 200 python3 -m bench.judge_latency --workers 1 --rounds 2 \
                 --count 4 --cache-dir "/tmp/kc-lat-$side"
               copies=6; [ "$side" = base ] && copies=2  # before: every timing holds the GPU ~7 s
               KFORGE_BENCH_ROOT=$root run "latency_16_$side" 200 python3 -m bench.judge_latency --workers 16 \
                 --copies $copies --rounds 1 --cache-dir "/tmp/kc-lat-$side"
               grep -E "medians|checks/min|not .correct" "$OUT/latency_1_$side.log" "$OUT/latency_16_$side.log" | cut -c1-400
             done ;;
    load) run load 400 python3 -m bench.judge_latency --set gen,kb,builtin --workers "${LOAD_WORKERS:-4}" \
            --rounds 3 --busy 2 --cache-dir /tmp/kc-load
          grep -E "rounds|not .correct|^   " "$OUT/load.log" | cut -c1-300 ;;
    startups) for n in ${STARTUPS:-0 2 4 0}; do  # the same pool with start-ups limited, interleaved on one machine
                run "startups_$n" 150 python3 -m bench.judge_latency --workers 16 --copies 6 \
                  --rounds 1 --startups "$n" --cache-dir /tmp/kc-startups
                grep -E "medians|checks/min|re-measured" "$OUT/startups_$n.log" | cut -c1-300
              done ;;
    loadattacks)
      python3 -c "while True: pass" & spin=$!
      setsid python3 -m bench.judge_latency --loop --set gen,kb,builtin --workers 4 \
        --cache-dir /tmp/kc-loadbusy > /dev/null 2>&1 & busy=$!
      sleep 20  # the busy pool's references are measured and its loop is judging
      run loadattacks 400 python3 -m bench.gpu_evaluator_corpus --only "${ATTACKS:-$ROUND5}" --cache-dir /tmp/kc-la
      kill "$spin"; kill -- -"$busy" 2>/dev/null
      grep -E "MISMATCH|as expected|attacks/" "$OUT/loadattacks.log" | cut -c1-220 ;;
    *) echo "unknown section $s (corpus, full6, ab6, throughput, baseline, reuse, repeat, only, latency, load, startups, loadattacks)" ;;
  esac
done
cat "$OUT/summary.txt"
