"""Is the EAGLE head's acceptance in the engine what the trainer measures, and how far does it
carry from the trainer's prompts to the bench's questions?

    python scripts/eagle_live_acceptance.py --threads 2 --limit 5 --trainer-prompts 20 [--head FOLDER]
        [--head-groups none|Q8_0|Q4_1]

For each prompt (the Spec-Bench questions, `--limit` per family, and `--trainer-prompts` fresh
prompts from the trainer's own source, drawn with a seed no data shard uses) the offline
preset's engine decodes greedily with drafter `eagle` at k = 1, every round drafting (a seeded
generation: no cost policy). Then the same reply is measured the trainer's way: one target
forward over prompt + reply gives the features, and the head drafts one token from every reply
position (specdec_core.train.ttt.measure_acceptance). Prints both first-position acceptances by
family. The engine's counts only rounds after a verify, the trainer's every position; where the
two agree the engine drafts from what the head was trained on, and the gap between the two
prompt sets is how much the head's acceptance depends on the prompts it was trained for.

The preset runs its head on Q8_0 groups of its own weights (the int4 kernel, as its 4-bit target);
`--head-groups none` measures the head as saved, `Q4_1` on coarser groups.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdec_core.bench.questions import load_questions  # noqa: E402
from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.drafters import Eagle3Head, EagleDrafter  # noqa: E402
from specdec_core.kernels.int4_linear import quantise_linear_layers  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402
from specdec_core.presets.sources import OFFLINE_PRESET, resolve_head  # noqa: E402
from specdec_core.sampling import SamplingParams  # noqa: E402
from specdec_core.train.dataset import Sequence, make_batch  # noqa: E402
from specdec_core.train.features import sequence_features  # noqa: E402
from specdec_core.train.prompts import direct_prompts  # noqa: E402
from specdec_core.train.ttt import Acceptance, measure_acceptance  # noqa: E402

FRESH_SEED = 987_654_321  # data shards draw theirs from seed * 1_000_003 + shard index


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--questions", default=str(Path(__file__).resolve().parents[2] / "shared/data/spec_bench_questions.jsonl"))
    parser.add_argument("--limit", type=int, default=5, help="Spec-Bench questions per family")
    parser.add_argument("--trainer-prompts", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--head", help="a head folder to measure instead of the preset's")
    parser.add_argument("--head-groups", choices=("none", "Q8_0", "Q4_1"),
                        help="run the head's linear layers on the int4 kernel from these groups of its weights "
                             "(none: as saved; default: as the preset loads it)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    models = load_preset(OFFLINE_PRESET, load_draft=False)
    if args.head or args.head_groups:
        folder = args.head or resolve_head(models.preset.eagle)
        models.eagle_head = Eagle3Head.load(folder, num_target_layers=models.target.config.num_hidden_layers)
        EagleDrafter(models.eagle_head, source=folder).bind(models.target, models.tokenizer)  # checks the fit
        if args.head_groups not in (None, "none"):
            quantise_linear_layers(models.eagle_head, args.head_groups)
    engine = models.make_engine("eagle", draft_length=1, adaptive=False)
    prompt_sets = {
        "Spec-Bench": [(q.family, q.prompt) for q in load_questions(args.questions, limit=args.limit)],
        "trainer's source": [(p.family, p.text) for p in direct_prompts(args.trainer_prompts, seed=FRESH_SEED)],
    }
    print("| prompts | family | replies | engine: accepted / drafted | trainer's measure on the same replies |")
    print("|---|---|---|---|---|")
    for name, prompts in prompt_sets.items():
        if not prompts:  # --limit 0 or --trainer-prompts 0 leaves a set out
            continue
        by_family: dict[str, list[int]] = {}
        for family, text in prompts:
            counts = by_family.setdefault(family, [0, 0, 0, 0, 0])
            for i, value in enumerate((1, *measure(models, engine, text, args.max_new_tokens))):
                counts[i] += value
        by_family["all"] = [sum(column) for column in zip(*by_family.values())]
        for family, (replies, accepted, drafted, matched, chains) in by_family.items():
            print(f"| {name} | {family} | {replies} | {accepted}/{drafted} = {accepted / max(drafted, 1):.3f} "
                  f"| {matched}/{chains} = {matched / max(chains, 1):.3f} |", flush=True)


def measure(models, engine, text: str, max_new_tokens: int) -> tuple[int, int, int, int]:
    """(accepted, drafted) in the engine at k = 1, and (matched, chains) of the trainer's measure."""
    tokenizer, target, head = models.tokenizer, models.target, models.eagle_head
    prompt = chat_prompt_ids(tokenizer, [{"role": "user", "content": text}])
    result = engine.generate(prompt, SamplingParams(max_new_tokens=max_new_tokens, seed=0))
    ids = prompt + list(result.token_ids)
    aux, final = sequence_features(target, ids[:-1], head.layer_ids)
    sequence = Sequence(ids=torch.tensor(ids), aux=aux, final=final, reply_start=len(prompt), mode="greedy", family="")
    sequence.greedy = sequence.ids[1:].clone()  # a greedy reply: the target's next token itself
    measured = measure_acceptance(head, target.get_input_embeddings(), make_batch([sequence], 1), 1, Acceptance(1))
    return result.stats.accepted_tokens, result.stats.drafted_tokens, measured.accepted[0], measured.chains


if __name__ == "__main__":
    main()
