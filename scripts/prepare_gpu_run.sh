#!/usr/bin/env bash
# Prepare, on a machine with pip and network, what the GPU check needs on a lent GPU machine that
# has no network (torch 2.11 + transformers 5.17 there): the transformers wheel this project pins
# and the one dependency whose version there may be too old for it, into .whl/ (git-ignored), and
# a copy of the reviewers' first-run probe into .probe/ (git-ignored). About 15 MB in all.
#   bash scripts/prepare_gpu_run.sh [path/to/gpu_first_run_checks.py]
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl .probe
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .whl "transformers==5.24.0" "regex==2025.11.3"
probe="${1:-../shared/tools/gpu_first_run_checks.py}"
if [ -f "$probe" ]; then
  # It was written when the architectures and build_model lived in specdec_core/cost_model.py.
  sed 's/from specdec_core.cost_model import/from specdec_core.bench.architectures import/' "$probe" > .probe/gpu_first_run_checks.py
fi
ls -la .whl .probe
