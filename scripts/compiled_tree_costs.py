"""What does a compiled tree verify step cost the offline 4-bit target, by node count, against the
compiled 1-token step and chain steps of as many tokens (and the eager tree step)? And do the
EAGLE head's trees on compiled steps reply as plain compiled decoding does, with how many tokens
per target forward and tokens/s against its chains? (issue 49, compiled tree steps)

    python scripts/compiled_tree_costs.py --threads 2 --contexts 128,512 --repeats 15 --step-sizes 1,8

It compiles at the priority it was started with, then lowers itself to --nice (19) before timing
anything: on a shared 2-core machine a compile at nice 19 got 1% of a core and never ended.

Steps are timed interleaved (each repeat runs every kind once, in turn), the median kept, each
from the same context (the cache cropped back after every step). Tree shapes are random (each
node under a random earlier node, at most 5 deep), a new one per repeat: one graph per node count
serves them all. The compiled steps are kept in --cache (default: the app's step cache, with the
app's feature layers: the steps the app's background compile saved load in seconds).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from specdec_core import EagleDrafter, SamplingParams, SpeculativeEngine  # noqa: E402
from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.decoding.compiled import CPU_STEP_SIZES, CPU_TREE_SIZES, CompiledSteps  # noqa: E402
from specdec_core.decoding.eager import CachedModel  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402
from specdec_core.presets.sources import cache_root  # noqa: E402

HEAD = Path(__file__).resolve().parent.parent / "heads" / "smollm2-135m-eagle3"
PROMPT = "Write a Python function that returns the squares of a list of numbers, and explain it."


def random_tree(nodes: int, rng: random.Random, deepest: int = 5) -> list[int]:
    parents, depths = [], [0]
    for _ in range(nodes):
        row = rng.choice([r for r, d in enumerate(depths) if d < deepest])
        parents.append(row - 1)
        depths.append(depths[row] + 1)
    return parents


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def step_costs(steps: CompiledSteps, target, context: int, repeats: int, rng: random.Random) -> None:
    vocab = target.config.vocab_size
    prompt = torch.randint(0, vocab, (context,), generator=torch.Generator().manual_seed(context)).tolist()
    compiled, eager = steps(), CachedModel(target)
    compiled.begin()
    for runner in (compiled, eager):
        runner.forward(prompt, last_only=True)
    kinds = {"1 token": lambda r: r.forward(prompt[-1:])}
    for nodes in steps.tree_sizes:
        tokens = prompt[-1:] * (nodes + 1)
        if steps.step_sizes[-1] > 1:  # (chains of one-token steps would say nothing)
            kinds[f"chain {nodes + 1}"] = lambda r, t=tokens: r.forward(t)
        kinds[f"tree {nodes}"] = lambda r, n=nodes: r.forward_tree(prompt[-1:] * (n + 1), random_tree(n, rng))
        kinds[f"eager tree {nodes}"] = lambda r, n=nodes: r.forward_tree(prompt[-1:] * (n + 1), random_tree(n, rng))
    times = {kind: [] for kind in kinds}
    for _ in range(repeats):
        for kind, call in kinds.items():
            runner = eager if kind.startswith("eager") else compiled
            times[kind].append(timed(lambda: call(runner)))
            runner.crop(context)
    one = statistics.median(times["1 token"])
    print(f"context {context}: load average {os.getloadavg()[0]:.1f}")
    for kind, samples in times.items():
        ms = statistics.median(samples)
        print(f"  {kind:14s} {ms * 1e3:7.2f} ms  {ms / one:5.2f}x the compiled 1-token step")


def replies(steps: CompiledSteps, models, tokens: int) -> None:
    target, tokenizer = models.target, models.tokenizer
    ids = chat_prompt_ids(tokenizer, [{"role": "user", "content": PROMPT}])
    params = SamplingParams(max_new_tokens=tokens)
    plain_engine = SpeculativeEngine(target, tokenizer, make_runner=steps)
    plain = plain_engine.generate(ids, params)
    print(f"plain compiled: {plain.stats.new_tokens / plain.stats.wall_s:.1f} tok/s")
    for label, tree_nodes in (("EAGLE chains", 0), ("EAGLE trees (policy)", None)):
        engine = SpeculativeEngine(target, tokenizer, drafter=EagleDrafter.from_pretrained(HEAD), make_runner=steps)
        engine.generate(ids, params, tree_nodes=tree_nodes)  # the policy measures its costs on a first reply
        engine.forget()
        result = engine.generate(ids, params, tree_nodes=tree_nodes)
        stats = result.stats
        print(f"{label}: identical to plain {result.token_ids == plain.token_ids}, "
              f"{stats.tokens_per_target_forward:.2f} tokens per target forward, {stats.tree_rounds} tree rounds, "
              f"{stats.new_tokens / stats.wall_s:.1f} tok/s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--contexts", default="128,512")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=96, help="new tokens of the replies (0: skip them)")
    parser.add_argument("--cache", default=str(cache_root() / "compiled"),
                        help="folder of the compiled steps (default: the app's, where its background compile saves them)")
    parser.add_argument("--tree-sizes", default=",".join(map(str, CPU_TREE_SIZES)), help="tree steps to compile (nodes)")
    parser.add_argument("--nice", type=int, default=19, help="niceness to time the steps and replies at")
    parser.add_argument("--step-sizes", default=",".join(map(str, CPU_STEP_SIZES)),
                        help="chain step sizes to compile (1,8 gives chains of 5, 9 and 17 tokens the app's "
                             "steps and compiles two graphs fewer)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    models = load_preset("smollm2-135m-local", compile=False)
    head = EagleDrafter.from_pretrained(HEAD)
    started = time.perf_counter()
    # The features the app's steps return (the EAGLE head's layers, and the last for the Medusa
    # heads the preset loads), so these are the app's step files.
    layers = {*head.feature_layers, *([models.target.config.num_hidden_layers] if models.medusa_heads is not None else [])}
    steps = CompiledSteps(models.target, step_sizes=[int(n) for n in args.step_sizes.split(",")], tree_sizes=[int(n) for n in args.tree_sizes.split(",")],
                          feature_layers=tuple(sorted(layers)), progress=False, cache_dir=args.cache)
    assert steps.compiled, steps.fallback_reason
    print(f"{len(steps.step_sizes)} chain and {len(steps.tree_sizes)} tree step shapes ready in "
          f"{time.perf_counter() - started:.0f} s (chains {steps.warmup_s:.0f} s, trees {steps.trees_warmup_s:.0f} s; "
          f"{steps.loaded} loaded from {args.cache})")
    os.nice(max(0, args.nice - os.nice(0)))
    rng = random.Random(0)
    with torch.inference_mode():
        for context in (int(c) for c in args.contexts.split(",")):
            step_costs(steps, models.target, context, args.repeats, rng)
    if args.tokens:
        replies(steps, models, args.tokens)


if __name__ == "__main__":
    main()
