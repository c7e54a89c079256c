"""Which head drafts better on the same held-out replies? Measures EAGLE heads on a trainer work
folder's held-out greedy replies, exactly as the trainer measures its own head at the end.

    python scripts/heldout_acceptance.py --work heads/my-head/train_work --shards 104 --data-dtype bfloat16 \
        heads/smollm2-135m-eagle3 heads/my-head

The data settings (--shards, --per-shard, --seed, --data-dtype, --passages) must be the run's: they decide
which shards are held out and, with --data-dtype other than "target", that the held-out replies
are those the target itself wrote again. A held-out prompt that is one of this run's training
prompts is left out, as the trainer does; a head trained on other data may still have trained on
some held-out prompt (the trainer's prompt source draws shard i's direct prompts from the seed and
i alone), so compare heads whose training shards are a subset of this run's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdec_core.drafters import Eagle3Head  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402
from specdec_core.presets.sources import OFFLINE_PRESET  # noqa: E402
from specdec_core.train.data import PASSAGE_SOURCES  # noqa: E402
from specdec_core.train.trainer import TrainSettings, acceptance, evaluation_set, load_split  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heads", nargs="+", help="head folders")
    parser.add_argument("--preset", default=OFFLINE_PRESET)
    parser.add_argument("--work", required=True, help="the trainer's work folder (its data/ and heldout_by_target/)")
    parser.add_argument("--shards", type=int, required=True)
    parser.add_argument("--per-shard", type=int, default=TrainSettings("", "").per_shard)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dtype", default="target")
    parser.add_argument("--passages", choices=PASSAGE_SOURCES, default=TrainSettings("", "").passages)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    settings = TrainSettings(args.preset, "-", work=args.work, shards=args.shards, per_shard=args.per_shard,
                             seed=args.seed, data_dtype=args.data_dtype, passages=args.passages, k=args.k)
    models = load_preset(args.preset, load_draft=False, load_eagle=False)
    target = models.target
    _, heldout = load_split(settings, models.tokenizer)
    evaluation = evaluation_set(heldout, target.get_output_embeddings().weight.detach().float())
    print(f"{len(evaluation)} held-out greedy replies of {args.work}")
    print(f"| head | {' | '.join(f'position {i + 1}' for i in range(args.k))} | mean accepted (k={args.k}) |")
    print("|---" * (args.k + 2) + "|")
    for folder in args.heads:
        head = Eagle3Head.load(folder, num_target_layers=target.config.num_hidden_layers).float()
        result = acceptance(head, target.get_input_embeddings(), evaluation, settings)
        print(f"| {folder} | {' | '.join(f'{a:.3f}' for a in result.by_position)} | {result.mean_accepted:.3f} |", flush=True)


if __name__ == "__main__":
    main()
