"""Entry point: `python -m specdec_core.cost_model ...` is the bench's `cost-model`
(specdec_core/bench/cost_model.py), as it was before the benchmark had its own folder."""

import sys

from .bench.cli import command_main


def main(argv: list[str] | None = None) -> int:
    return command_main("cost-model", argv, prog="python -m specdec_core.cost_model")


if __name__ == "__main__":
    sys.exit(main())
