"""Cache rollback, stops, clamping, draft-length bounds, vocabularies and bad input."""

import copy
import time
from contextlib import contextmanager

import pytest
import torch

from specdec_core import EagleDrafter, HybridDrafter, ModelDrafter, PromptLookupDrafter, SamplingParams, SpeculativeEngine
from specdec_core.bench.methods import trace_forwards
from specdec_core.drafter import Draft, Drafter
from specdec_core.policy import MAX_DRAFT_LENGTH
from tests.tiny_models import perturbed_copy, random_eagle_head, tiny_llama, tiny_qwen2

PROMPT = "Once upon a time, in a land far away, there lived"


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0)


@pytest.fixture(scope="module")
def prompt_ids(smol_tokenizer):
    return smol_tokenizer(PROMPT)["input_ids"]


def greedy(n=24, **kw):
    return SamplingParams(max_new_tokens=n, **kw)


def test_cache_rollback_keeps_exact_state(target, smol_tokenizer, prompt_ids):
    """At every round the target cache holds exactly the context minus its last token, and the
    logits it gives for the next position equal an uncached forward over the whole context."""
    draft = perturbed_copy(target, noise=0.1, seed=3)  # rejects now and then
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft), draft_length=4)
    context = list(prompt_ids)
    checks = []
    original_verify = engine._verify

    def checked_verify(runner, last_token, draft):
        logits = original_verify(runner, last_token, draft)
        with torch.no_grad():
            fresh = target(torch.tensor([context])).logits[0, -1]
        checks.append((runner.length - len(draft.tokens) - 1 == len(context) - 1,
                       torch.allclose(logits[0], fresh, atol=1e-4)))
        return logits

    engine._verify = checked_verify
    for event in engine.stream(prompt_ids, greedy(30)):
        context.append(event.token_id)
    assert engine.stats.accepted_tokens < engine.stats.drafted_tokens, "no rejection was exercised"
    assert len(checks) == engine.stats.target_forwards - 1 and all(a and b for a, b in checks)


def test_eos_inside_accepted_draft_ends_output_there(target, smol_tokenizer, prompt_ids):
    baseline = SpeculativeEngine(target, smol_tokenizer).generate(prompt_ids, greedy(24)).token_ids
    stop_at = next(i for i in range(4, 24) if baseline[i] not in baseline[:i])
    eos_target = copy.deepcopy(target)
    eos_target.generation_config.eos_token_id = baseline[stop_at]
    # The target drafting for itself accepts everything, so the EOS arrives inside a draft.
    engine = SpeculativeEngine(eos_target, smol_tokenizer, drafter=ModelDrafter(eos_target), draft_length=8,
                               adaptive=False)
    result = engine.generate(prompt_ids, greedy(24))
    assert result.token_ids == baseline[: stop_at + 1]
    assert result.sources[-1] == "draft"


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 9])
def test_max_new_tokens_is_never_exceeded(target, smol_tokenizer, prompt_ids, limit):
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(target), draft_length=8)
    result = engine.generate(prompt_ids, greedy(limit))
    assert len(result.token_ids) == limit == result.stats.new_tokens


def test_stop_string_ends_the_reply(target, smol_tokenizer, prompt_ids):
    full = SpeculativeEngine(target, smol_tokenizer).generate(prompt_ids, greedy(24)).text
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    assert stop.strip(), "the reply needs visible text to pick a stop string from"
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter())
    result = engine.generate(prompt_ids, SamplingParams(max_new_tokens=24, stop=(stop,)))
    assert result.text == full[: full.index(stop)]  # OpenAI's rule: the reply ends before the stop string
    assert result.stats.finish_reason == "stop" and len(result.token_ids) < 24


def test_text_that_may_begin_a_stop_string_waits_and_the_pieces_add_up(target, smol_tokenizer, prompt_ids):
    plain = list(SpeculativeEngine(target, smol_tokenizer).stream(prompt_ids, greedy(24)))
    full = "".join(e.text for e in plain)
    absent = full[:8] + "\u2603"  # begins as the reply does, never completed
    held = list(SpeculativeEngine(target, smol_tokenizer).stream(prompt_ids,
                                                                  SamplingParams(max_new_tokens=24, stop=(absent,))))
    assert "".join(e.text for e in held) == full  # held back while it might stop, then released
    assert [e.text for e in held] != [e.text for e in plain] and held[0].text == ""


def test_fixed_draft_length_drafts_every_round(target, smol_tokenizer, prompt_ids):
    fixed = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(tiny_llama(seed=9)),
                              draft_length=3, adaptive=False)
    result = fixed.generate(prompt_ids, greedy(30))
    assert result.stats.draft_length == 3 and len(result.stats.drafted_by_position) == 3
    assert "target" not in result.sources[:-1]  # every round drafted (only the last may be clamped)


class SlowDrafter(PromptLookupDrafter):
    """Proposes junk slowly: speculation can't pay, so the engine must stop asking it."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def propose(self, context, k, params, generator):
        import time

        self.calls += 1
        time.sleep(0.02)
        from specdec_core import Draft
        return Draft([(context[-1] + 1 + i) % 1000 for i in range(k)])


def test_engine_falls_back_to_plain_decoding_when_drafting_does_not_pay(target, smol_tokenizer, prompt_ids):
    drafter = SlowDrafter()
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter)
    result = engine.generate(prompt_ids, greedy(60))
    rounds = engine.stats.target_forwards - 1
    assert rounds >= 50 and drafter.calls <= 8, f"asked the drafter {drafter.calls} times in {rounds} rounds"
    assert result.token_ids == SpeculativeEngine(target, smol_tokenizer).generate(prompt_ids, greedy(60)).token_ids


def test_the_draft_catches_up_apart_and_a_kept_engine_spares_it_when_drafting_does_not_pay(target, smol_tokenizer):
    long_prompt = list(range(100, 400))
    drafter = ModelDrafter(perturbed_copy(target, noise=0.1, seed=3))
    drafter.reset(long_prompt)
    assert drafter.lag(long_prompt) == 298  # all but the two a proposal reads itself
    drafter.catch_up(long_prompt)
    assert drafter.lag(long_prompt) == 0 and drafter._runner.length == 298

    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter)
    engine.generate(long_prompt, greedy(8))  # the first reply tries the draft: it catches up
    costs = engine.policy.costs
    assert costs.catch_up_seconds.weight > 0
    costs.draft_s_per_token = 10 * costs.target(1)  # now drafting plainly can't pay
    catch_ups = costs.catch_up_seconds.weight
    engine.generate(list(range(500, 800)), greedy(8))  # a new long prompt: the draft would read it all
    assert engine.stats.drafted_tokens == 0 and costs.catch_up_seconds.weight == catch_ups  # no probe


def test_stats_add_up(target, smol_tokenizer, prompt_ids):
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(perturbed_copy(target, 0.05, 1)))
    result = engine.generate(prompt_ids, greedy(30))
    s = result.stats
    assert s.new_tokens == 30 == len(result.sources)
    assert s.accepted_tokens == result.sources.count("draft")
    assert sum(s.accepted_by_position) == s.accepted_tokens and sum(s.drafted_by_position) == s.drafted_tokens
    assert s.target_forwards == 1 + sum(1 for src in result.sources if src != "draft")
    assert s.tokens_per_target_forward == pytest.approx(30 / s.target_forwards)
    assert 0 < s.ttft_s <= s.wall_s and s.draft_s > 0 and s.verify_s > 0
    assert s.tokens_per_second == pytest.approx(30 / s.wall_s)
    # the decode phase: the tokens after the first round (its accepted drafts and its own token)
    first_round = next(i for i, src in enumerate(result.sources) if src != "draft") + 1
    assert s.first_round_tokens == first_round
    assert s.decode_tokens_per_second == pytest.approx((30 - first_round) / (s.wall_s - s.ttft_s))
    assert set(s.as_dict()) >= {
        "new_tokens", "target_forwards", "tokens_per_target_forward", "drafted_tokens", "accepted_tokens",
        "acceptance_rate", "accepted_by_position", "drafted_by_position", "draft_length", "ttft_s",
        "wall_s", "tokens_per_second", "draft_s", "verify_s", "first_round_tokens", "decode_tokens_per_second",
    }


def test_side_by_side_halves_read_the_same_prompt_tokens_from_the_same_cache_state(target, smol_tokenizer, prompt_ids):
    """The app's side by side: share_reading before the baseline, and again with the baseline's
    start before the speculative half, so the speculative engine reads the prompt's new tokens
    itself (a prefill forward of its own) instead of finding them read by the baseline."""
    from specdec_core.decoding.eager import CachedModel, KeptRunner

    kept = KeptRunner(CachedModel, target)
    plain = SpeculativeEngine(target, smol_tokenizer, kept=kept)
    spec = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter(), kept=kept)
    spec.generate(prompt_ids[:6], greedy(4))  # an earlier turn: the cache holds a part of the prompt
    start = spec.share_reading(prompt_ids)
    assert 0 < start < len(prompt_ids) - 1
    base = plain.generate(prompt_ids, greedy(12))
    assert spec.share_reading(prompt_ids, at_most=start) == start  # back to where the baseline started
    result = spec.generate(prompt_ids, greedy(12))
    assert result.token_ids == base.token_ids
    rounds = sum(source != "draft" for source in result.sources)
    assert (plain.stats.target_forwards, spec.stats.target_forwards) == (1 + 12, 1 + rounds)  # each a prefill


def test_stream_exposes_running_stats_and_stops_when_closed(target, smol_tokenizer, prompt_ids):
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter())
    stream = engine.stream(prompt_ids, greedy(50))
    seen = [engine.stats.new_tokens for _, _ in zip(range(5), stream)]
    assert seen == [1, 2, 3, 4, 5] or seen[-1] >= 5
    stream.close()
    forwards = engine.stats.target_forwards
    assert engine.stats.new_tokens < 50 and engine.stats.target_forwards == forwards


def test_draft_with_a_differently_padded_vocabulary(smol_tokenizer, prompt_ids):
    """Qwen2.5-7B and -0.5B pad their embeddings differently; the draft here has extra rows."""
    target = tiny_qwen2(seed=0)
    draft = tiny_qwen2(seed=0, vocab=target.config.vocab_size + 64)
    with torch.no_grad():
        draft.model.embed_tokens.weight[: target.config.vocab_size] = target.model.embed_tokens.weight
    expected = SpeculativeEngine(target, smol_tokenizer).generate(prompt_ids, greedy(20)).token_ids
    for params in (greedy(20), SamplingParams(temperature=1.0, max_new_tokens=20, seed=0)):
        engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft))
        result = engine.generate(prompt_ids, params)
        assert all(t < target.config.vocab_size for t in result.token_ids)
    assert SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft)).generate(
        prompt_ids, greedy(20)).token_ids == expected


def test_draft_with_another_tokenizer_is_refused(target, smol_tokenizer, tmp_path):
    other = copy.deepcopy(smol_tokenizer)
    other.add_tokens(["<totally-new-token>"])
    draft = tiny_llama(seed=1)
    draft.config.name_or_path = "tiny-draft"
    target.config.name_or_path = "tiny-target"
    with pytest.raises(ValueError, match="tiny-draft.*tiny-target"):
        SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft, tokenizer=other))


@pytest.mark.parametrize("bad, field", [([], "prompt"), (list(range(600)), "prompt")])
def test_bad_prompts(target, smol_tokenizer, bad, field):
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter())
    with pytest.raises(ValueError, match=field):
        engine.generate(bad, greedy())


def test_bad_draft_length(target, smol_tokenizer):
    with pytest.raises(ValueError, match="draft_length"):
        SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter(), draft_length=0)


def test_text_pieces_add_up_to_the_decode(smol_tokenizer):
    """Multi-byte characters span several byte-level tokens; the pieces must still add up."""
    from specdec_core.detok import IncrementalDetokenizer

    text = "Ünïcödé ✓ 東京タワー 🦙🚀 code:\n```py\nx = '<&>'\n```"
    ids = smol_tokenizer(text)["input_ids"]
    detok = IncrementalDetokenizer(smol_tokenizer)
    pieces = [detok.push(i) for i in ids] + [detok.flush()]
    assert "".join(pieces) == smol_tokenizer.decode(ids, skip_special_tokens=True) == text
    assert any(p == "" for p in pieces), "some character spans several tokens"


def test_random_output_text_adds_up(target, smol_tokenizer, prompt_ids):
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(perturbed_copy(target, 0.05, 1)))
    result = engine.generate(prompt_ids, SamplingParams(temperature=1.2, max_new_tokens=40, seed=4))
    assert result.text == smol_tokenizer.decode(result.token_ids, skip_special_tokens=True)


def test_a_plain_round_keeps_what_the_draft_read(target, smol_tokenizer):
    """Telling the draft how many drafts were kept when none is pending (the engine did so after
    plain rounds) must not crop what it read: it once cropped the draft's kept conversation to
    nothing, and each new setting or chat turn whose first round was plain had the draft read it
    all again (2,500 tokens of the real preset's nf4 draft: 4.7 s)."""
    prompt = list(range(100, 400))
    drafter = ModelDrafter(perturbed_copy(target, noise=0.1, seed=3))
    drafter.bind(target, smol_tokenizer)
    drafter.reset(prompt)
    drafter.catch_up(prompt)
    drafter.accepted(0)  # a plain round, before any proposal
    assert drafter._runner.length == 298 and drafter.lag(prompt) == 0
    drafter.propose(prompt, 3, SamplingParams(), torch.Generator())  # feeds two drafts
    drafter.accepted(1)
    assert drafter._runner.length == len(prompt) + 1
    drafter.accepted(0)  # the next round is plain: nothing of the proposal is left to crop
    assert drafter._runner.length == len(prompt) + 1


@contextmanager
def tokens_read(model):
    """The input tokens of every forward of `model` inside the block (filled when it ends)."""
    counts: list[int] = []
    with trace_forwards(model) as calls:
        yield counts
    counts.extend(inputs for _, inputs in calls)


def test_a_chats_next_turn_reads_only_its_new_tokens(target, smol_tokenizer):
    """The engine keeps its target's and its draft's caches from one reply to the next."""
    draft = perturbed_copy(target, noise=0.05, seed=4)
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft), draft_length=3, adaptive=False)
    first_prompt = list(range(300, 400))
    first = engine.generate(first_prompt, greedy(12)).token_ids
    second_prompt = first_prompt + first + list(range(600, 620))  # the reply, then the user's next message
    with tokens_read(target) as target_reads, tokens_read(draft) as draft_reads:
        stream = engine.stream(second_prompt, greedy(12))
        next(stream)
    # The target's cache held the first prompt and the reply but its last token (never fed).
    assert target_reads[0] == len(second_prompt) - 1 - (len(first_prompt) + len(first) - 1) == 20
    assert sum(draft_reads) < 40  # its catch-up and one proposal; a fresh draft reads all 132
    stream.close()
    # What a kept cache gives equals what reading everything gives.
    fresh = SpeculativeEngine(target, smol_tokenizer, drafter=ModelDrafter(draft), draft_length=3, adaptive=False)
    assert engine.generate(second_prompt, greedy(12)).token_ids == fresh.generate(second_prompt, greedy(12)).token_ids


def test_retry_reads_nothing_again_and_gives_the_same_reply(target, smol_tokenizer, prompt_ids):
    prompt = list(prompt_ids) + list(range(300, 340))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=PromptLookupDrafter())
    first = engine.generate(prompt, greedy(16)).token_ids
    with tokens_read(target) as reads:
        again = engine.generate(prompt, greedy(16)).token_ids
    assert again == first
    assert len(reads) == engine.stats.target_forwards and reads[0] <= 1 + MAX_DRAFT_LENGTH  # no prefill


def test_a_reply_stopped_by_the_consumer_is_kept_and_a_failed_one_is_forgotten(target, smol_tokenizer, prompt_ids):
    engine = SpeculativeEngine(target, smol_tokenizer)
    stream = engine.stream(prompt_ids, greedy(20))
    shown = [next(stream).token_id for _ in range(5)]
    stream.close()  # the user pressed Stop
    follow_up = list(prompt_ids) + shown + [500, 501]
    with tokens_read(target) as reads:
        engine.generate(follow_up, greedy(4))
    assert reads[0] == 2  # the last shown token (never fed) and 500; 501 is the first round's

    class FailsOnDemand(PromptLookupDrafter):
        fail = False

        def propose(self, context, k, params, generator):
            if self.fail:
                raise RuntimeError("boom")
            return super().propose(context, k, params, generator)

    drafter = FailsOnDemand()
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, adaptive=False)
    engine.generate(prompt_ids, greedy(8))
    drafter.fail = True
    with pytest.raises(RuntimeError, match="boom"):
        engine.generate(follow_up, greedy(8))
    drafter.fail = False
    with tokens_read(target) as reads:
        engine.generate(follow_up, greedy(2))
    assert reads[0] == len(follow_up) - 1  # a failed reply may have left a forward halfway: read afresh


@contextmanager
def head_pairs_read(drafter):
    """Positions the EAGLE head's layer reads in the block (pairs and draft steps)."""
    counts: list[int] = []
    handle = drafter.head.midlayer.register_forward_hook(lambda module, args, out: counts.append(out.shape[1]))
    try:
        yield counts
    finally:
        handle.remove()


@pytest.mark.parametrize("hybrid", [False, True], ids=["eagle", "hybrid"])
def test_an_eagle_heads_next_turn_reads_only_its_new_tokens(target, smol_tokenizer, hybrid):
    """The head keeps its cache and the features it got, as the target keeps its cache: a chat's
    next turn costs neither of them the earlier turns, and no extra target forward."""
    eagle = EagleDrafter(random_eagle_head(target, seed=2))
    drafter = HybridDrafter(eagle) if hybrid else eagle
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=drafter, draft_length=3, adaptive=False)
    first_prompt = list(range(300, 400))
    first = engine.generate(first_prompt, greedy(12)).token_ids
    second_prompt = first_prompt + first + list(range(600, 620))
    with tokens_read(target) as target_reads, head_pairs_read(eagle) as head_reads:
        stream = engine.stream(second_prompt, greedy(12))
        next(stream)
    assert target_reads[0] == 20  # the prefill: only the new message (as with any drafter)
    assert sum(head_reads) < 40  # the new pairs and the draft steps; a fresh head reads all 131
    stream.close()
    fresh = SpeculativeEngine(target, smol_tokenizer, drafter=EagleDrafter(eagle.head), draft_length=3, adaptive=False)
    assert engine.generate(second_prompt, greedy(12)).token_ids == fresh.generate(second_prompt, greedy(12)).token_ids
    # Retry (the same prompt again): nothing is read again by the target, the head reads at most a round.
    with tokens_read(target) as target_reads:
        engine.generate(second_prompt, greedy(12))
    assert target_reads[0] <= 1 + 3


def test_an_eagle_head_that_kept_less_than_the_target_gets_the_features_it_lacks(target, smol_tokenizer):
    """A different conversation that shares only a prefix: the head's kept pairs past it are
    dropped, and the target's prefill starts where the head needs features (one token earlier
    than its own cache would), so the reply is the same as from scratch."""
    eagle = EagleDrafter(random_eagle_head(target, seed=2))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=eagle, draft_length=3, adaptive=False)
    engine.generate(list(range(300, 400)), greedy(8))
    other = list(range(300, 350)) + list(range(700, 730))
    with tokens_read(target) as target_reads:
        result = engine.generate(other, greedy(12)).token_ids
    assert target_reads[0] == len(other) - 1 - 48  # pairs 0..47 stand: features from 48 on
    fresh = SpeculativeEngine(target, smol_tokenizer, drafter=EagleDrafter(eagle.head), draft_length=3, adaptive=False)
    assert result == fresh.generate(other, greedy(12)).token_ids
    assert eagle.features_from() >= len(other) - 1


def test_an_eagle_head_for_another_target_is_refused_in_one_line(target, smol_tokenizer):
    from specdec_core.errors import LoadError

    other_vocab = tiny_llama(seed=1, vocab=1000)
    with pytest.raises(LoadError, match="vocabulary") as raised:
        SpeculativeEngine(target, smol_tokenizer, drafter=EagleDrafter(random_eagle_head(other_vocab)))
    assert "\n" not in str(raised.value)
    from transformers import LlamaConfig
    from specdec_core.drafters import Eagle3Head

    narrow = Eagle3Head.random(LlamaConfig(vocab_size=target.config.vocab_size, hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(LoadError, match="hidden size"):
        SpeculativeEngine(target, smol_tokenizer, drafter=EagleDrafter(narrow))


def test_an_eagle_head_reads_a_new_prompt_as_catch_up(target, smol_tokenizer):
    """The prompt's features come from the prefill; the head reads them before the first round,
    timed as catch-up (not as drafting), so the policy's drafting cost stays per draft token."""
    eagle = EagleDrafter(random_eagle_head(target, seed=2))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=eagle, draft_length=3, adaptive=False)
    prompt = list(range(300, 400))
    with head_pairs_read(eagle) as reads:
        engine.generate(prompt, greedy(4))
    assert reads[0] == len(prompt) - 1  # one batched pass over the prompt's pairs: the catch-up
    assert engine.policy.costs.catch_up_seconds.weight > 0  # timed as catch-up
    assert 0 < engine.stats.catch_up_s < engine.stats.draft_s  # counted apart, within the drafting time
    assert max(reads[1:]) <= 1 + 3  # then each round: the accepted positions, the draft steps


class AskedHybrid(HybridDrafter):
    """A hybrid that counts the rounds the engine asks it to draft."""

    def __init__(self, learned):
        super().__init__(learned)
        self.asked = 0

    def propose(self, context, k, params, generator):
        self.asked += 1
        return super().propose(context, k, params, generator)


class DearWrongDrafter(Drafter):
    """A learned drafter that is slow and always proposes the last token again."""

    name = "draft"

    def propose(self, context, k, params, generator):
        time.sleep(0.01)
        return Draft([context[-1]] * k)


def test_a_hybrid_is_asked_every_round_after_its_learned_drafter_misses(target, smol_tokenizer, prompt_ids):
    """The hybrid gates its learned drafter itself; gated also by the engine from estimates
    pooled over both sources, a few misses of the head paused lookup too (issue: the hybrid's
    stuck state)."""
    hybrid = AskedHybrid(DearWrongDrafter())
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=hybrid)
    result = engine.generate(prompt_ids, greedy(40))
    rounds = engine.stats.rounds
    assert any(drafted == 0 for drafted, _ in rounds[1:])  # the learned drafter sat out...
    assert hybrid.asked >= len(rounds) - 2  # ...yet every round but calibration (and the last) asked
    assert result.token_ids == SpeculativeEngine(target, smol_tokenizer).generate(prompt_ids, greedy(40)).token_ids
