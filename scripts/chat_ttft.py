"""Time to first token of each turn of a four-turn chat: with the caches the engine kept from
the previous turn, and reading the whole conversation again (`engine.forget()` first).

    python scripts/chat_ttft.py                      # smollm2-135m-local, prompt lookup

The script says per turn whether the (greedy) reply was the same both ways: a token's last bits
depend on the call that read it, so at an exact tie of two logits they can part.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specdec_core import SamplingParams  # noqa: E402
from specdec_core.chat import chat_prompt_ids  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402

QUESTIONS = (
    "Explain how a bicycle gear system works, in detail.",
    "Now explain it for a child.",
    "Write a short poem about it.",
    "Summarize everything you said so far in three bullet points.",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-local")
    parser.add_argument("--drafter", default="prompt_lookup", choices=("none", "prompt_lookup", "model"))
    parser.add_argument("--max-new-tokens", type=int, default=200)
    args = parser.parse_args()
    models = load_preset(args.preset, load_draft=args.drafter == "model")
    engine = models.make_engine(drafter=args.drafter)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    turns: list[dict] = []
    for question in QUESTIONS:
        turns.append({"role": "user", "content": question})
        prompt = chat_prompt_ids(models.tokenizer, turns)
        kept = engine.generate(prompt, params)  # the engine still holds the previous turn
        engine.forget()
        cold = engine.generate(prompt, params)
        print(f"prompt {len(prompt)} tokens: time to first token {cold.stats.ttft_s * 1000:.0f} ms reading "
              f"it all, {kept.stats.ttft_s * 1000:.0f} ms with the kept caches; "
              f"same reply: {kept.token_ids == cold.token_ids}")
        turns.append({"role": "assistant", "content": cold.text})
    return 0


if __name__ == "__main__":
    sys.exit(main())
