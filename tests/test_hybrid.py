"""The hybrid drafter's choices, from measured costs and acceptance: which source drafts, and how
many tokens the learned one is asked for."""

import torch

from specdec_core.drafter import Draft, Drafter
from specdec_core.drafters.hybrid import PROBE_EVERY, HybridDrafter
from specdec_core.policy import AcceptanceByPosition, StepCosts
from specdec_core.sampling import SamplingParams
from tests.test_policy import BLOCKED_MS  # the 4-bit offline target's forward costs by token count

GREEDY = SamplingParams(temperature=0.0)


class CountingDrafter(Drafter):
    """A learned drafter that proposes token 7 as often as asked and remembers the lengths asked."""

    name = "eagle"

    def __init__(self):
        self.asked = []

    def propose(self, context, k, params, generator):
        self.asked.append(k)
        return Draft([7] * k)


def hybrid_with(acceptance: float, draft_ms: float) -> tuple[HybridDrafter, CountingDrafter]:
    learned = CountingDrafter()
    hybrid = HybridDrafter(learned)
    hybrid.use_costs(StepCosts(target_s={n: ms / 1000 for n, ms in BLOCKED_MS.items()}))
    source = hybrid.sources["eagle"]
    source.acceptance, source.draft_s_per_token = AcceptanceByPosition.of(acceptance), draft_ms / 1000
    return hybrid, learned


def propose(hybrid, k):
    context = [1, 2, 3, 4, 5, 6]  # nothing repeats: prompt lookup finds no match
    return hybrid.propose(context, k, GREEDY, torch.Generator())


def test_a_weak_head_is_asked_for_its_own_best_length_not_the_engines():
    # Right 40% of the time, 1.4 ms a draft: one draft gains 1.4 / 1.16 = 1.2x a plain step,
    # five would lose (1.7 tokens for 2.1 steps).
    hybrid, learned = hybrid_with(acceptance=0.4, draft_ms=1.4)
    assert len(propose(hybrid, k=5).tokens) == 1 and learned.asked == [1]


def test_a_strong_head_drafts_up_to_the_cheap_block_size():
    hybrid, learned = hybrid_with(acceptance=0.8, draft_ms=1.4)
    propose(hybrid, k=8)
    assert learned.asked == [3]  # 4 rows verify at 1.3 steps; 5 rows cost 1.76


def test_a_head_that_cannot_pay_sits_out_with_a_probe_every_so_often():
    hybrid, learned = hybrid_with(acceptance=0.05, draft_ms=5.0)
    drafts = [propose(hybrid, k=4) for _ in range(PROBE_EVERY + 1)]
    assert [len(d.tokens) for d in drafts[:PROBE_EVERY]] == [0] * PROBE_EVERY
    assert learned.asked == [1]  # the probe, at the length that would pay most


def test_an_unmeasured_head_is_asked_for_the_engines_length():
    learned = CountingDrafter()
    hybrid = HybridDrafter(learned)
    hybrid.use_costs(StepCosts())
    propose(hybrid, k=5)
    assert learned.asked == [5]


def test_lookup_drafts_only_as_far_as_pays_at_its_acceptance():
    hybrid, learned = hybrid_with(acceptance=0.0, draft_ms=5.0)  # the head loses: lookup's turn
    hybrid.sources["lookup"].acceptance = AcceptanceByPosition.of(0.5)
    context = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]  # "1 2 3" occurred: lookup offers 4 5 6 7 8
    draft = hybrid.propose(context, 5, GREEDY, torch.Generator())
    # At 0.5 two drafts give 1.75 tokens for 1.09 steps; three 1.875 for 1.19; five 1.97 for 1.84.
    assert draft.tokens == [4, 5] and learned.asked == []

