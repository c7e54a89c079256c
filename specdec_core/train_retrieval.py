"""Entry point: `python -m specdec_core.train_retrieval --preset NAME --work WORK --out DIR` builds
the retrieval drafter's datastore from a trainer work folder's shards (specdec_core/train/datastore.py)."""

import sys

from .train.datastore import main

if __name__ == "__main__":
    sys.exit(main())
