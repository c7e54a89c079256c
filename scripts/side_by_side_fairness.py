"""The app's side-by-side comparison, timed through the app's own reply loop (`specdec_app.reply.reply`):
a short prompt and a long one (a text to summarize), each sent twice as a new conversation.

    nice -n 19 python scripts/side_by_side_fairness.py          # smollm2-135m-local, prompt lookup

Per run: both halves' time to first token, the speedup the pane shows, the end-to-end ratio
(tokens/s over tokens/s) and the decode-phase ratio (tokens after the first round over the
engine time after the first token), and whether the greedy outputs were identical. Issue 45:
with the prompt read alike on both sides, the end-to-end figure lies between 1 and the
decode-phase one.

Measured with --threads 1 on a 2-core machine shared with other work (prompt lookup, greedy, 48
tokens; all replies identical). Before issue 45, on a 1043-token prompt: TTFT 1.40 / 1.57 s baseline
against 0.03-0.06 s speculative, the pane showing 1.81x and 3.38x for decode-phase 1.02x and 1.64x;
"Speedup now" on a long prompt read whole 0.47x and 0.63x (its 1.6 s TTFT in the figure). After:
TTFT 1.35-1.53 s baseline, 1.46-2.38 s speculative (the same call: repeated alone it spreads
1.41-2.46 s here), end to end 1.23 / 0.82 / 1.17 / 0.85x for decode phase 1.58 / 1.17 / 1.59 / 1.11x;
"Speedup now" 2.02x and 1.65x read whole, 1.80x and 1.81x from the kept cache.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specdec_app import history as H  # noqa: E402
from specdec_app import reply as app  # noqa: E402  (the reply loop the app runs)
from specdec_app import render as R  # noqa: E402
from specdec_app import speedup as S  # noqa: E402
from specdec_app.settings import Meter, Settings  # noqa: E402
from specdec_core.presets.loading import load_preset  # noqa: E402

SHORT = "Write a short story about a cat who learns to fly."


def long_prompt(words: int) -> str:
    """A pasted text to summarize: the start of models.yaml (its comments are prose)."""
    text = " ".join((REPO / "models.yaml").read_text(encoding="utf-8").split()[:words])
    return f"Summarize this text in three sentences:\n\n{text}"


def first_round_tokens(sources: list[str]) -> int:
    """Tokens of the first round: its accepted drafts and the target's token that closes it."""
    for i, source in enumerate(sources):
        if source != "draft":
            return i + 1
    return len(sources)


def decode_rate(stats: dict, sources: list[str]) -> float:
    after = len(sources) - first_round_tokens(sources)
    seconds = stats["wall_s"] - stats["ttft_s"]
    return after / seconds if after > 0 and seconds > 0 else 0.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-local")
    parser.add_argument("--drafter", default="prompt_lookup")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--long-words", type=int, default=560, help="words of the long prompt (~1000 tokens)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (1 degrades gracefully on a machine shared with other work)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    models = load_preset(args.preset, compile=False, load_draft=args.drafter == "model")
    halves: list[tuple[dict, list[str], list[int]]] = []
    stream = app.stream_reply

    def recording(*a, **k):  # the last update of each half: its stats, sources and tokens
        for update in stream(*a, **k):
            yield update
        halves.append((update[2], list(update[4]), list(update[3])))

    app.stream_reply = recording
    settings = Settings(preset=args.preset, drafter=args.drafter, temperature=0.0, top_p=1.0, top_k=0,
                        max_new_tokens=args.max_new_tokens, draft_length=5, adaptive=True, baseline=False, compare=True)
    meter = Meter(S.BaselineBook(), H.ReplyHistory())
    print("| prompt | baseline TTFT | speculative TTFT | pane shows | end-to-end | decode phase "
          "| decode tok/s (baseline, speculative) | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for name, message in (("short", SHORT), ("long", long_prompt(args.long_words))):
        for attempt in ("", ", again"):
            halves.clear()
            turns = [R.new_turn(message, baseline_pending=True)]
            for view in app.reply(models, turns, settings, threading.Event(), meter):
                last = view
            (base, base_sources, base_ids), (spec, spec_sources, spec_ids) = halves
            tokens = len(app.checked_prompt(models.engine(drafter="none"), turns))
            shown = re.findall(r"\d+\.\d\d×", last.speedup)
            print(f"| {tokens} tokens{attempt} | {base['ttft_s']:.2f} s | {spec['ttft_s']:.2f} s | "
                  f"{' / '.join(shown)} | {spec['tokens_per_second'] / base['tokens_per_second']:.2f}x | "
                  f"{decode_rate(spec, spec_sources) / decode_rate(base, base_sources):.2f}x | "
                  f"{decode_rate(base, base_sources):.1f}, {decode_rate(spec, spec_sources):.1f} | "
                  f"{base_ids == spec_ids} |", flush=True)
    # Then "Speedup now" of a speculative reply alone: the long prompt again (read from the kept
    # cache) and another long one (read whole), against the plain rates side by side recorded.
    alone = replace(settings, compare=False)
    print("\n| speculative reply | TTFT | Speedup now shown |\n|---|---|---|")
    for name, message in (("long prompt, from the kept cache", long_prompt(args.long_words)),
                          ("another long prompt, read whole", long_prompt(args.long_words).replace("three", "five"))):
        halves.clear()
        for view in app.reply(models, [R.new_turn(message)], alone, threading.Event(), meter):
            last = view
        figure = re.search(r"Speedup now: ([^*]+)\*\*", last.live).group(1)
        print(f"| {name} | {halves[-1][0]['ttft_s']:.2f} s | {figure} |", flush=True)
    print("\nThe last pane and panel as shown:\n", last.live, sep="\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
