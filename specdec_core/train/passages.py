"""Human-written passages for the trainer's summarize / answer-from / translate prompts.

Why: the offline head drafts the target's replies over text the target wrote itself far better
than over human text. Measured at the first draft position, greedy (the engine at k = 1, 5
passages each): summaries of the target's own news reports 0.46 against 0.21 for Spec-Bench's
news articles; answers from its own passages 0.49-0.56 against 0.30 for Spec-Bench's RAG. The
target's own text is predictable to the head; human text, with its names and unexpected words,
is what a user pastes. The human prose every machine has offline is Python's reference
documentation, which CPython ships for `help()` (pydoc_data.topics): about 200 passages of
technical English. Not news, but written by people.

Passages are split by index into a training pool and a held-out pool (every tenth), so no
held-out prompt reads a passage a training prompt reads.
"""

from __future__ import annotations

import re
from functools import cache

MIN_WORDS = 30  # shorter paragraphs are mostly headings, grammar rules or one-line notes
# Consecutive paragraphs of a topic are joined to at least PASSAGE_WORDS, and a passage is cut
# (at a sentence end) at MAX_WORDS: about the 160 tokens of a passage the target wrote. The data
# writer pads a batch to its longest prompt, and one 550-token passage made a shard 1.6x slower.
PASSAGE_WORDS = 80
MAX_WORDS = 120


@cache
def documentation_passages() -> tuple[tuple[str, str], ...]:
    """(topic, passage) pairs of prose from Python's reference documentation: code blocks
    (indented lines), interpreter sessions, headings and short paragraphs left out, and every
    paragraph used once (some topics repeat sections of others)."""
    from pydoc_data.topics import topics

    passages, seen = [], set()
    for name, text in sorted(topics.items()):
        joined: list[str] = []
        for paragraph in re.split(r"\n\s*\n", text):
            words = paragraph.split()
            prose = len(words) >= MIN_WORDS and ">>>" not in paragraph and not re.search(r"^ ", paragraph, re.M)
            if not prose or " ".join(words) in seen:
                continue
            seen.add(" ".join(words))
            joined += words
            if len(joined) >= PASSAGE_WORDS:
                passages.append((name.replace("-", " "), _cut(joined)))
                joined = []
        if joined:
            passages.append((name.replace("-", " "), _cut(joined)))
    return tuple((topic, passage) for topic, passage in passages if len(passage.split()) >= MIN_WORDS)


def _cut(words: list[str]) -> str:
    """The words, at most MAX_WORDS of them, ending at the last sentence end when cut."""
    if len(words) <= MAX_WORDS:
        return " ".join(words)
    kept = words[:MAX_WORDS]
    ends = [i for i, word in enumerate(kept) if word.endswith((".", ".)", '."'))]
    return " ".join(kept[: ends[-1] + 1] if ends else kept)


def passage_pool(held_out: bool) -> list[tuple[str, str]]:
    """The held-out pool (every tenth passage) or the training pool (the rest)."""
    return [p for i, p in enumerate(documentation_passages()) if (i % 10 == 8) == held_out]
