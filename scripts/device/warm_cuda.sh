#!/usr/bin/env bash
# Warm ranks on a GPU machine (run through the session's device tool from the repo root, with
# the wheels of pydantic and its needs for its Python in .whl/, carried): scripts/device/warm_cuda.py.
set -euo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl
export PYTHONPATH="/tmp/site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L
python3 scripts/device/warm_cuda.py "${OUT:-/tmp}/warm-cuda" 2>&1 | tee "${OUT:-/tmp}/warm_cuda.log"
cp "${OUT:-/tmp}/warm-cuda/warm_cuda.json" "${OUT:-/tmp}/" 2>/dev/null || true
