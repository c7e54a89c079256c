"""Measure a preset: load time and memory of its models, then acceptance rate and tokens/s of
each drafter on three chat prompts (greedy, so every drafter must give the baseline's tokens).

    python scripts/measure_presets.py                       # smollm2-135m-local, 128 tokens
    python scripts/measure_presets.py --no-adaptive --json results.json

CPU timings depend on what else runs on the machine: the script prints the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_core import SamplingParams  # noqa: E402
from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402

PROMPTS = {
    "code": "Write a Python function that checks whether a string is a palindrome, with a docstring and two examples.",
    "rewrite": (
        "Rewrite this paragraph in plain words, keeping its facts: Speculative decoding lets a small "
        "draft model propose several tokens which the large target model then verifies in a single "
        "forward pass. Accepted tokens are kept, and the first rejected token is replaced by the "
        "target's own choice, so the output is exactly what the target alone would produce."
    ),
    "open": "What are three good habits for staying healthy while working at a desk all day?",
}
DRAFTERS = ("none", "prompt_lookup", "model")


def rss_mb() -> float:
    """Resident memory of this process now, in MB (Linux /proc)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure_load(preset: str) -> tuple[object, dict]:
    before = rss_mb()
    started = time.perf_counter()
    models = load_preset(preset)
    load = {
        "preset": models.preset.name,
        "total_load_s": round(time.perf_counter() - started, 2),
        "rss_increase_mb": round(rss_mb() - before),
        "models": [
            {
                "role": i.role, "name": i.name, "parameters": i.parameters, "memory_mb": round(i.memory_bytes / 1e6),
                "device": i.device, "dtype": i.dtype, "quantization": i.quantization, "load_s": round(i.load_s, 2),
            }
            for i in models.info
        ],
    }
    return models, load


def measure_drafters(models, max_new_tokens: int, adaptive: bool | None) -> list[dict]:
    params = SamplingParams(max_new_tokens=max_new_tokens)
    rows = []
    for prompt_name, prompt in PROMPTS.items():
        prompt_ids = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": prompt}])
        baseline = None
        for drafter in DRAFTERS:
            result = models.make_engine(drafter=drafter, adaptive=adaptive).generate(prompt_ids, params)
            baseline = result.token_ids if drafter == "none" else baseline
            stats = result.stats
            rows.append({
                "prompt": prompt_name, "drafter": drafter, "new_tokens": stats.new_tokens,
                "acceptance_rate": round(stats.acceptance_rate, 3),
                "drafted_tokens": stats.drafted_tokens,
                "tokens_per_target_forward": round(stats.tokens_per_target_forward, 2),
                "tokens_per_second": round(stats.tokens_per_second, 1),
                "wall_s": round(stats.wall_s, 2),
                "same_as_baseline": result.token_ids == baseline,
            })
            print(_row_line(rows[-1]), file=sys.stderr, flush=True)
    return rows


def _row_line(row: dict) -> str:
    return (
        f"{row['prompt']:<8} {row['drafter']:<14} {row['new_tokens']:>4} tok  "
        f"acceptance {row['acceptance_rate']:>5.0%} ({row['drafted_tokens']} drafted)  "
        f"{row['tokens_per_target_forward']:.2f} tok/forward  {row['tokens_per_second']:>5.1f} tok/s  "
        f"same as baseline: {row['same_as_baseline']}"
    )


def summary(rows: list[dict]) -> list[str]:
    """Per drafter over the three prompts: pooled acceptance and tokens/s."""
    lines = []
    for drafter in DRAFTERS:
        mine = [r for r in rows if r["drafter"] == drafter]
        tokens = sum(r["new_tokens"] for r in mine)
        seconds = sum(r["wall_s"] for r in mine)
        drafted = sum(r["drafted_tokens"] for r in mine)
        accepted = sum(r["acceptance_rate"] * r["drafted_tokens"] for r in mine)
        rate = f"{accepted / drafted:.0%}" if drafted else "n/a"
        lines.append(f"{drafter:<14} acceptance {rate:>4}  {tokens / seconds:5.1f} tokens/s over {tokens} tokens")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-local")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--no-adaptive", action="store_true", help="fixed draft length (the preset's)")
    parser.add_argument("--json", help="also write the results to this file")
    args = parser.parse_args()

    load_average = os.getloadavg()[0]
    models, load = measure_load(args.preset)
    print(json.dumps(load, indent=1), file=sys.stderr)
    models.make_engine(drafter="none").generate(  # warm-up: first-call allocations, lazy init
        chat_prompt_ids(models.tokenizer, [{"role": "user", "content": "Hi"}]), SamplingParams(max_new_tokens=4)
    )
    rows = measure_drafters(models, args.max_new_tokens, False if args.no_adaptive else None)
    print(f"\nload average at start {load_average:.1f} on {os.cpu_count()} cores, now {os.getloadavg()[0]:.1f}")
    for line in summary(rows):
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "runs": rows, "load_average": load_average}, indent=1))
    return 0 if all(r["same_as_baseline"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
