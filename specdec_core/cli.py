"""What the command lines (`python -m specdec_core`, the benchmark, the cost model) share:
one-line errors (exit code 2, never a traceback) and notes on stderr."""

from __future__ import annotations

import sys
from collections.abc import Callable

from .errors import LoadError

EXIT_ERROR = 2


def run_guarded(command: Callable[[], int]) -> int:
    """Run a command line's work: a bad file, a model that can't load or a bad setting ends it
    with one line on stderr and EXIT_ERROR; Ctrl-C with 130."""
    try:
        return command()
    except (LoadError, ValueError) as error:  # a preset file's ConfigError is a ValueError
        print(f"error: {one_line(error)}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130


def one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def inform(*lines: str) -> None:
    """Notes for the user on stderr, so stdout keeps only the command's output."""
    for line in lines:
        print(line, file=sys.stderr)
