"""`python -m specdec_core.train_medusa --preset NAME --out DIR`: train Medusa heads."""

from __future__ import annotations

import argparse
import shlex
import sys

from ..cli import inform, run_guarded
from .data import PASSAGE_SOURCES
from .medusa import MedusaSettings, train_medusa
from .trainer import DATA_DTYPES, SAVE_DTYPES, TRAIN_DTYPES


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_core.train_medusa", description=__doc__)
    d = MedusaSettings("", "")
    p.add_argument("--preset", required=True, help="the preset whose target the heads draft for")
    p.add_argument("--out", required=True, help="the heads folder to write (new, empty, or an unfinished run's)")
    p.add_argument("--config", help="a models.yaml other than the bundled one")
    p.add_argument("--work", help="data shards and checkpoints (default OUT/train_work; an EAGLE run's work folder "
                                  "shares its data); rerun to resume")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--shards", type=int, default=d.shards, help=f"data shards to generate and use ({d.per_shard} prompts each)")
    p.add_argument("--per-shard", type=int, default=d.per_shard)
    p.add_argument("--gen-batch", type=int, default=d.gen_batch, help="prompts per batched generate")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="reply length cap in the data")
    p.add_argument("--passages", choices=PASSAGE_SOURCES, default=d.passages)
    p.add_argument("--data-dtype", choices=["target", *sorted(DATA_DTYPES)], default=d.data_dtype,
                   help="what writes the data: the target as it decodes, or its weights in bf16 (faster on CPUs with AMX)")
    p.add_argument("--train-dtype", choices=sorted(TRAIN_DTYPES), default=d.train_dtype)
    p.add_argument("--heads", type=int, default=d.heads, help="Medusa heads (head i guesses the token i+1 after the next)")
    p.add_argument("--layers", type=int, default=d.layers, help="residual blocks per head")
    p.add_argument("--train-vocab", type=int, default=d.train_vocab, help="readout tokens while training (the most frequent)")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per optimizer step")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps")
    p.add_argument("--top-k", type=int, default=d.top_k, help="k of the held-out top-k accuracy")
    p.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default=d.save_dtype)
    p.add_argument("--max-minutes", type=float, help="stop training after this long and write the heads")
    p.add_argument("--threads", type=int, help="torch threads")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)

    def command() -> int:
        for name in ("shards", "per_shard", "gen_batch", "max_new_tokens", "heads", "train_vocab", "epochs", "batch", "top_k"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        if args.layers < 1:
            raise ValueError("--layers must be at least 1")
        settings = MedusaSettings(**vars(args), command=shlex.join(["python", "-m", "specdec_core.train_medusa", *argv]))
        summary = train_medusa(settings)
        final = summary["heldout"]
        top_k = final[f"top{final['top_k']}"]
        inform(f"wrote {args.out}: held-out top-1 accuracy by head {final['top1']}, top-{final['top_k']} {top_k}, "
               f"mean accepted {final['mean_accepted']}")
        return 0

    return run_guarded(command)
