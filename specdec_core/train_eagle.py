"""Entry point: `python -m specdec_core.train_eagle --preset NAME --out DIR` runs the trainer
wing (specdec_core/train/): train an EAGLE-3 draft head for a preset's target."""

import sys

from .train.base import keep_freed_memory
from .train.cli import main

if __name__ == "__main__":
    keep_freed_memory()  # this process is a trainer's: see base.keep_freed_memory
    sys.exit(main())
