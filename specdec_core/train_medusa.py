"""Entry point: `python -m specdec_core.train_medusa --preset NAME --out DIR` trains Medusa heads
for a preset's target (specdec_core/train/medusa.py), on the EAGLE trainer's data pipeline."""

import sys

from .train.base import keep_freed_memory
from .train.medusa_cli import main

if __name__ == "__main__":
    keep_freed_memory()  # this process is a trainer's: see base.keep_freed_memory
    sys.exit(main())
