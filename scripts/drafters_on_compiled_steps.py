"""Every drafter of a preset in the app's own engines (LoadedModels.engine, default settings)
after its background compile: greedy tokens/s on three chat prompts, and whether each reply is
the baseline's token for token (issue 48, point 0).

    nice -n 19 python scripts/drafters_on_compiled_steps.py --max-new-tokens 64 --rounds 3

Interleaved rounds, the median kept. Every reply starts cold (engine.forget(), as the bench's
timed runs): engines share the target's kept cache, and a prompt part another engine re-read in
calls of other sizes rounds apart in its last bits, which can break a tie of two logits. The
rate is of decoding: new tokens after the first over the time after it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from scripts.measure_presets import PROMPTS  # noqa: E402
from specdec_core import SamplingParams  # noqa: E402
from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-local")
    parser.add_argument("--drafters", default="none,eagle,hybrid,prompt_lookup")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    drafters = args.drafters.split(",")
    started = time.perf_counter()
    models = load_preset(args.preset)
    models.wait_for_compiling()
    print(f"loaded and compiled in {time.perf_counter() - started:.0f} s; load average {os.getloadavg()[0]:.1f}")
    print(models.describe())
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    rates = {d: [] for d in drafters}
    identical = {d: 0 for d in drafters}
    for name, text in PROMPTS.items():
        prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": text}])
        baseline = None
        for _ in range(args.rounds):
            for drafter in drafters:
                engine = models.engine(drafter)
                assert engine.make_runner is models.target_runner, f"{drafter} runs on {engine.make_runner}"
                engine.forget()
                result = engine.generate(prompt, params)
                stats = result.stats
                rates[drafter].append((len(result.token_ids) - 1) / (stats.wall_s - stats.ttft_s))
                baseline = baseline or (result.token_ids if drafter == "none" else None)
                identical[drafter] += result.token_ids == baseline
    total = len(PROMPTS) * args.rounds
    print(f"greedy, {args.max_new_tokens} tokens, {len(PROMPTS)} prompts x {args.rounds} rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    base = statistics.median(rates["none"]) if "none" in rates else None
    for drafter in drafters:
        rate = statistics.median(rates[drafter])
        vs = f"  {rate / base:.2f}x none" if base else ""
        print(f"{drafter:14s} {rate:6.1f} tok/s (median){vs}  identical to none: {identical[drafter]}/{total}")


if __name__ == "__main__":
    main()
