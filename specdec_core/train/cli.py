"""`python -m specdec_core.train_eagle --preset NAME --out DIR`: train an EAGLE-3 head."""

from __future__ import annotations

import argparse
import shlex
import sys

from ..cli import inform, run_guarded
from .data import PASSAGE_SOURCES, PROMPT_SOURCES
from .trainer import DATA_DTYPES, SAVE_DTYPES, TRAIN_DTYPES, TrainSettings, train


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specdec_core.train_eagle", description=__doc__)
    d = TrainSettings("", "")
    p.add_argument("--preset", required=True, help="the preset whose target the head drafts for")
    p.add_argument("--out", required=True, help="the head folder to write (new, empty, or an unfinished run's)")
    p.add_argument("--config", help="a models.yaml other than the bundled one")
    p.add_argument("--work", help="data shards and checkpoints (default OUT/train_work); rerun to resume")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--shards", type=int, default=d.shards, help=f"data shards to generate and use ({d.per_shard} prompts each)")
    p.add_argument("--per-shard", type=int, default=d.per_shard)
    p.add_argument("--gen-batch", type=int, default=d.gen_batch, help="prompts per batched generate")
    p.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="reply length cap in the data")
    p.add_argument("--passages", choices=PASSAGE_SOURCES, default=d.passages,
                   help="passages of the summarize / answer-from / translate prompts: the target's own writing, "
                        "or half of them human prose (Python's reference documentation)")
    p.add_argument("--prompts", choices=PROMPT_SOURCES, default=d.prompts,
                   help="the prompt source: template prompts, or a varied mix (pasted prose and code, requests and "
                        "second turns the target writes itself; see docs/training.md)")
    p.add_argument("--data-dtype", choices=["target", *sorted(DATA_DTYPES)], default=d.data_dtype,
                   help="what writes the data: the target as it decodes, or its weights in bf16 (faster on CPUs with AMX)")
    p.add_argument("--train-dtype", choices=sorted(TRAIN_DTYPES), default=d.train_dtype,
                   help="what the head's matmuls run in while training (bfloat16: autocast, faster on CPUs with AMX)")
    p.add_argument("--draft-vocab", type=int, default=d.draft_vocab)
    p.add_argument("--ttt-steps", type=int, default=d.ttt_steps, help="unrolled draft steps in training")
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--batch", type=int, default=d.batch, help="sequences per optimizer step")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="steps")
    p.add_argument("--k", type=int, default=d.k, help="draft length of the acceptance measurement")
    p.add_argument("--save-dtype", choices=sorted(SAVE_DTYPES), default=d.save_dtype)
    p.add_argument("--max-minutes", type=float, help="stop training after this long and write the head")
    p.add_argument("--threads", type=int, help="torch threads")
    p.add_argument("--data-only", action="store_true", help="write the data shards and stop (rerun to resume)")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)

    def command() -> int:
        for name in ("shards", "per_shard", "gen_batch", "max_new_tokens", "draft_vocab", "ttt_steps", "epochs", "batch", "k"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1")
        settings = TrainSettings(**{k: v for k, v in vars(args).items()}, command=shlex.join(["python", "-m", "specdec_core.train_eagle", *argv]))
        summary = train(settings)
        if args.data_only:
            inform(f"wrote the data shards in {settings.work_dir / 'data'}")
            return 0
        final = summary["heldout_acceptance"]
        inform(f"wrote {args.out}: held-out acceptance by position {final['by_position']}, "
               f"mean accepted {final['mean_accepted']} at k={final['k']}")
        return 0

    return run_guarded(command)
