"""`python -m specdec_core.train_eagle --preset NAME --out DIR`: train an EAGLE-3 head."""

from __future__ import annotations

import argparse
import sys

from .base import add_run_arguments, run_command
from .trainer import TrainSettings, train


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_core.train_eagle", description=__doc__)
    d = TrainSettings("", "")
    head = add_run_arguments(p, d, "head")
    head.add_argument("--draft-vocab", type=int, default=d.draft_vocab)
    head.add_argument("--ttt-steps", type=int, default=d.ttt_steps, help="unrolled draft steps in training")
    head.add_argument("--k", type=int, default=d.k, help="draft length of the acceptance measurement")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_command(parser(), argv, TrainSettings, train, ("draft_vocab", "ttt_steps", "k"), _result)


def _result(summary: dict) -> str:
    final = summary["heldout_acceptance"]
    return f"held-out acceptance by position {final['by_position']}, mean accepted {final['mean_accepted']} at k={final['k']}"
