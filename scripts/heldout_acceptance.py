"""Which head drafts better on the same held-out replies? Measures EAGLE heads on held-out greedy
replies, exactly as the trainer measures its own head at the end, on up to three sets:

- `trainer`: a trainer work folder's held-out shards (the replies the target itself wrote again);
- `everyday`: the everyday prompts written for the check (specdec_core/train/data/everyday_prompts.jsonl);
- `spec_bench`: Spec-Bench's questions, `--limit` per family (evaluation only).

    python scripts/heldout_acceptance.py --work heads/my-head/train_work --shards 104 --data-dtype bfloat16 \
        --sets trainer,everyday,spec_bench heads/smollm2-135m-eagle3 heads/my-head

For `trainer` the data settings (--shards, --per-shard, --seed, --data-dtype, --passages) must be the run's: they decide
which shards are held out and, with --data-dtype other than "target", that the held-out replies
are those the target itself wrote again. A held-out prompt that is one of this run's training
prompts is left out, as the trainer does; a head trained on other data may still have trained on
some held-out prompt (the trainer's prompt source draws shard i's direct prompts from the seed and
i alone), so compare heads whose training shards are a subset of this run's. For the other two
sets the target writes its greedy replies once (192 tokens at most) into `--replies` (default
WORK/prompt_sets), and every later run measures on those.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdec_core.bench.questions import load_questions  # noqa: E402
from specdec_core.drafters import Eagle3Head  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402
from specdec_core.presets.sources import OFFLINE_PRESET  # noqa: E402
from specdec_core.train.data import PASSAGE_SOURCES  # noqa: E402
from specdec_core.train.prompt_sets import everyday_prompts, replies_to  # noqa: E402
from specdec_core.train.trainer import TrainSettings, acceptance, evaluation_set, load_split  # noqa: E402


SETS = ("trainer", "everyday", "spec_bench")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("heads", nargs="+", help="head folders")
    parser.add_argument("--preset", default=OFFLINE_PRESET)
    parser.add_argument("--sets", default="trainer", help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--work", help="the trainer's work folder (its data/ and heldout_by_target/)")
    parser.add_argument("--shards", type=int)
    parser.add_argument("--per-shard", type=int, default=TrainSettings("", "").per_shard)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data-dtype", default="target")
    parser.add_argument("--passages", choices=PASSAGE_SOURCES, default=TrainSettings("", "").passages)
    parser.add_argument("--prompts", choices=("templates", "varied"), default=TrainSettings("", "").prompts)
    parser.add_argument("--rewrite-heldout", type=int, metavar="N", help="the run's --rewrite-heldout: measure on the first "
                        "N held-out shards the target wrote again (default: all)")
    parser.add_argument("--questions", default=str(Path(__file__).resolve().parents[2] / "shared/data/spec_bench_questions.jsonl"))
    parser.add_argument("--limit", type=int, default=10, help="Spec-Bench questions per family")
    parser.add_argument("--replies", help="where the target's replies to the prompt sets are kept (default WORK/prompt_sets)")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    sets = args.sets.split(",")
    if unknown := [name for name in sets if name not in SETS]:
        parser.error(f"unknown sets {', '.join(unknown)}: choose from {', '.join(SETS)}")
    if ("trainer" in sets and (not args.work or not args.shards)) or not (args.work or args.replies):
        parser.error("--work and --shards are needed for the trainer's set, --work or --replies for the others")
    if args.threads:
        torch.set_num_threads(args.threads)

    settings = TrainSettings(args.preset, "-", work=args.work, shards=args.shards or 1, per_shard=args.per_shard,
                             seed=args.seed, data_dtype=args.data_dtype, passages=args.passages, prompts=args.prompts,
                             rewrite_heldout=args.rewrite_heldout, k=args.k)
    models = load_preset(args.preset, load_draft=False, compile=False, load_eagle=False, load_medusa=False)
    target = models.target
    layers = target.config.num_hidden_layers
    heads = {folder: Eagle3Head.load(folder, num_target_layers=layers).float() for folder in args.heads}
    layer_ids = next(iter(heads.values())).layer_ids
    if any(head.layer_ids != layer_ids for head in heads.values()):
        parser.error("the heads read different target layers: measure them apart")
    lm_head = target.get_output_embeddings().weight.detach().float()
    replies = Path(args.replies) if args.replies else Path(args.work) / "prompt_sets"
    for name in sets:
        if name == "trainer":
            evaluation = evaluation_set(load_split(settings, models.tokenizer)[1], lm_head)
            what = f"held-out greedy replies of {args.work}"
        else:
            prompts = everyday_prompts() if name == "everyday" else [
                (q.family, q.prompt) for q in load_questions(args.questions, limit=args.limit)]
            evaluation = evaluation_set(replies_to(name, prompts, target, models.tokenizer, replies, tuple(layer_ids)),
                                        lm_head)
            what = f"greedy replies of the target to {len(prompts)} {name} prompts"
        print(f"\n{name}: {len(evaluation)} {what}")
        print(f"| head | {' | '.join(f'position {i + 1}' for i in range(args.k))} | mean accepted (k={args.k}) |")
        print("|---" * (args.k + 2) + "|")
        for folder, head in heads.items():
            result = acceptance(head, target.get_input_embeddings(), evaluation, settings)
            print(f"| {folder} | {' | '.join(f'{a:.3f}' for a in result.by_position)} | {result.mean_accepted:.3f} |",
                  flush=True)


if __name__ == "__main__":
    main()
