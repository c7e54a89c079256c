"""Prompt lookup's n-gram index: what it proposes is exactly find_continuation's scan of the
whole context, round after round and from one sequence to the next."""

import random

from specdec_core import PromptLookupDrafter, SamplingParams
from specdec_core.drafters import find_continuation


def test_the_index_proposes_what_a_scan_of_the_whole_context_finds():
    rng = random.Random(0)
    drafter = PromptLookupDrafter(max_ngram=3, min_ngram=1)
    params = SamplingParams()
    proposals = 0
    for _ in range(200):
        context = [rng.randrange(6) for _ in range(rng.randrange(1, 8))]  # a small vocabulary: many repeats
        for _ in range(40):
            k = rng.randrange(1, 9)
            proposed = drafter.propose(context, k, params, None).tokens
            assert proposed == find_continuation(context, 3, 1, k), (context, k)
            proposals += bool(proposed)
            if rng.random() < 0.05:  # another sequence that shares a prefix (a retry, a new turn)
                context = context[: rng.randrange(1, len(context) + 1)] + [rng.randrange(6)]
            else:  # the same sequence grows by a round's tokens
                context = context + [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
    assert proposals > 1000  # it did find text to copy


def test_the_longest_ngram_wins_and_its_latest_occurrence():
    drafter = PromptLookupDrafter(max_ngram=2, min_ngram=1)
    context = [1, 2, 7, 5, 2, 8, 1, 2, 9, 3, 2]
    assert drafter.propose(context, 3, SamplingParams(), None).tokens == [9, 3, 2]  # "2" last followed by 9
    assert drafter.propose(context + [9], 2, SamplingParams(), None).tokens == [3, 2]  # "2 9": after the bigram
    assert drafter.propose([4, 4], 2, SamplingParams(), None).tokens == [4]  # a new sequence, read afresh
