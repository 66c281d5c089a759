#!/usr/bin/env bash
# `kforge doctor` on a GPU machine: the table and the JSON for the tiny and kevin presets (and any preset
# named in $PRESETS), written to $OUT (or ./doctor-out). Run from the repository root:
#
#     bash bench/gpu_doctor.sh
#
# The GPU image lacks some of kforge's pure-Python dependencies (pydantic-settings, python-dotenv; pydantic
# itself, gguf and vLLM come with the vLLM bundle of ../shared/device). Stage their wheels on a machine with
# PyPI access first, into a folder that travels with the working tree (name it in `carry`):
#
#     pip download --no-deps -d .devcarry/kforge-deps pydantic-settings python-dotenv typing-inspection \
#         pydantic==2.14.3 pydantic-core==2.50.4 annotated-types==0.8.0 psutil gguf
#
# Extra `key=value` overrides for every preset go in $DOCTOR_ARGS (e.g. DOCTOR_ARGS="model.name=/models/qwen7b").
#
# This script installs them with `pip install --no-index --no-deps --target /tmp/kforge-site` when kforge's
# config cannot be imported. It exits with the highest doctor exit code (0 = every preset can start).
set -u
OUT_DIR="${OUT:-doctor-out}"
mkdir -p "$OUT_DIR"
PY="${PYTHON:-python3}"
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"   # no network there: the model check reports the local cache

# vLLM bundle from ../shared/device, when it was assembled on this machine.
[ -d /tmp/site ] && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}"

if ! "$PY" -c "import kforge.config.loader" 2>/dev/null; then
  if ls .devcarry/kforge-deps/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install --quiet --no-index --no-deps --target /tmp/kforge-site .devcarry/kforge-deps/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/kforge-site"
  fi
fi
if ! "$PY" -c "import kforge.config.loader" 2>"$OUT_DIR/import_error.txt"; then
  echo "kforge does not import here (see $OUT_DIR/import_error.txt); stage the wheels named at the top of $0"
  tail -3 "$OUT_DIR/import_error.txt"
  exit 3
fi

{ nvidia-smi; echo; nvcc --version 2>&1 | tail -2; } > "$OUT_DIR/machine.txt" 2>&1
worst=0
for preset in ${PRESETS:-tiny kevin}; do
  start=$(date +%s)
  "$PY" -m kforge doctor --preset "$preset" --runs-dir /tmp/kforge-runs --json ${DOCTOR_ARGS:-} > "$OUT_DIR/doctor_${preset}.json"
  code=$?
  COLUMNS=160 "$PY" -m kforge doctor --preset "$preset" --runs-dir /tmp/kforge-runs ${DOCTOR_ARGS:-} > "$OUT_DIR/doctor_${preset}.txt" 2>&1
  echo "preset $preset: exit $code in $(( $(date +%s) - start )) s"
  "$PY" - "$OUT_DIR/doctor_${preset}.json" <<'EOF'
import json, sys
for row in json.load(open(sys.argv[1])):
    if row["status"] != "pass" or row["check"] in ("gpus", "torch CUDA", "triton kernel", "nvcc"):
        print(f"  {row['status']:4}  {row['check']}: {row['detail']}" + (f"  -> {row['fix']}" if row["fix"] else ""))
EOF
  [ "$code" -gt "$worst" ] && worst=$code
done
exit "$worst"
