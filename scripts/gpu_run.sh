#!/usr/bin/env bash
# The GPU check in one call on a lent GPU machine (see docs/gpu.md). Needs what
# scripts/prepare_gpu_run.sh put into .whl/ and .probe/ (carry both). Writes into $OUT (at most 8
# files come back): gpu_check.json/.md, cost_model.md, cost_model_eagle.md, ceiling_free.md,
# ceiling_c.md and run.log. Ends inside 9.5 minutes: each step has its own timeout. PARTS=a,b
# runs only those parts of the check (a second call for what a first one had no time for).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-gpu_out}"
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
{
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "could not install the carried wheels"; exit 3; }
  export PYTHONPATH="/tmp/site:$PWD"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv || true
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  if [ -f .probe/gpu_first_run_checks.py ]; then  # CUDA graphs across threads, the cache keyword
    timeout 120 python3 .probe/gpu_first_run_checks.py kwarg thread || echo "probe: exit $?"
  fi
  timeout 450 python3 -m specdec_core.gpu_check --out "$OUT" ${PARTS:+--parts "$PARTS"} || echo "gpu_check: exit $?"
} 2>&1 | tee "$OUT/run.log"
