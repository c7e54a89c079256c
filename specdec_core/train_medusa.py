"""Entry point: `python -m specdec_core.train_medusa --preset NAME --out DIR` trains Medusa heads
for a preset's target (specdec_core/train/medusa.py), on the EAGLE trainer's data pipeline."""

import sys

from .train.medusa_cli import main

if __name__ == "__main__":
    sys.exit(main())
