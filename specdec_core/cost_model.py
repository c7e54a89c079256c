"""Entry point: `python -m specdec_core.cost_model ...` runs the bench wing's cost model
(specdec_core/bench/cost_model.py), as it did before the benchmark had its own folder."""

import sys

from .bench.cost_model import main

if __name__ == "__main__":
    sys.exit(main())
