"""`python -m specdec_core.train_medusa --preset NAME --out DIR`: train Medusa heads."""

from __future__ import annotations

import argparse
import sys

from .base import add_run_arguments, run_command
from .medusa import MedusaSettings, train_medusa


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_core.train_medusa", description=__doc__)
    d = MedusaSettings("", "")
    heads = add_run_arguments(p, d, "heads")
    heads.add_argument("--heads", type=int, default=d.heads, help="Medusa heads (head i guesses the token i+1 after the next)")
    heads.add_argument("--layers", type=int, default=d.layers, help="residual blocks per head")
    heads.add_argument("--train-vocab", type=int, default=d.train_vocab, help="readout tokens while training (the most frequent)")
    heads.add_argument("--top-k", type=int, default=d.top_k, help="k of the held-out top-k accuracy")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_command(parser(), argv, MedusaSettings, train_medusa, ("heads", "layers", "train_vocab", "top_k"), _result)


def _result(summary: dict) -> str:
    final = summary["heldout"]
    top_k = final[f"top{final['top_k']}"]
    return f"held-out top-1 accuracy by head {final['top1']}, top-{final['top_k']} {top_k}, mean accepted {final['mean_accepted']}"
