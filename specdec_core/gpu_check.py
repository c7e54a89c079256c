"""Entry point: `python -m specdec_core.gpu_check --out DIR [--tiny]` is the bench's `gpu-check`
(specdec_core/bench/gpu_check/): correctness, the fast path, the ceiling, bf16 ties, loading and
the app on one GPU with random weights of real shapes."""

import sys

from .bench.cli import command_main


def main(argv: list[str] | None = None) -> int:
    return command_main("gpu-check", argv, prog="python -m specdec_core.gpu_check")


if __name__ == "__main__":
    sys.exit(main())
