"""Entry point: `python -m specdec_core.gpu_check --out DIR [--tiny]` runs the bench wing's GPU
check (specdec_core/bench/gpu_check.py): correctness, the fast path, the ceiling, bf16 ties,
loading and the app on one GPU with random weights of real shapes."""

import sys

from .bench.gpu_check import main

if __name__ == "__main__":
    sys.exit(main())
