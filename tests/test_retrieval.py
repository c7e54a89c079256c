"""The retrieval drafter (specdec_core/drafters/retrieval.py): its datastore's index against a
brute-force count, its files, and that speculation with it stays exactly the target's output."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest

from specdec_core import SamplingParams, SpeculativeEngine
from specdec_core.drafters.retrieval import ORDERS, Datastore, RetrievalDrafter
from specdec_core.errors import LoadError
from tests.tiny_models import tiny_llama


def brute_force_next(sequences: list[list[int]], context: list[int]) -> int | None:
    """The most frequent follower (ties: the smaller token) of the longest of the context's last
    ORDERS tokens that occurs in a sequence with a token after it."""
    for n in sorted(ORDERS, reverse=True):
        if len(context) < n:
            continue
        tail = tuple(context[-n:])
        followers = Counter(s[i + n] for s in sequences for i in range(len(s) - n) if tuple(s[i : i + n]) == tail)
        if followers:
            return min(followers, key=lambda token: (-followers[token], token))
    return None


def test_the_index_gives_the_most_frequent_follower_of_the_longest_match():
    rng = random.Random(0)
    # A small vocabulary makes repeats, and so ties and every order, common.
    sequences = [[rng.randrange(6) for _ in range(rng.randrange(1, 40))] for _ in range(60)]
    store = Datastore.from_sequences(sequences)
    assert store.tokens == sum(len(s) for s in sequences)
    for _ in range(400):
        context = [rng.randrange(7) for _ in range(rng.randrange(0, 8))]  # token 6: never in the store
        assert store.next_token(context) == brute_force_next(sequences, context), context


def test_no_ngram_spans_two_sequences():
    store = Datastore.from_sequences([[1, 2, 3], [4, 5]])
    assert store.next_token([2, 3]) is None  # 3 ends the first sequence: nothing follows it
    assert store.next_token([3, 4]) is None  # not an n-gram of either sequence
    assert store.next_token([1, 2]) == 3 and store.next_token([7, 4]) is None


def test_the_drafter_proposes_the_stored_continuation_token_by_token():
    store = Datastore.from_sequences([[10, 11, 12, 13, 14, 15], [20, 11, 12, 99]])
    drafter = RetrievalDrafter(store)
    params = SamplingParams()
    # [11, 12] is followed by 13 once and 99 once: the tie goes to the smaller token.
    assert drafter.propose([5, 11, 12], 3, params, None).tokens == [13, 14, 15]
    assert drafter.propose([10, 11, 12], 8, params, None).tokens == [13, 14, 15]  # the store's end
    assert drafter.propose([1, 2, 3], 4, params, None).tokens == []
    assert drafter.propose([20, 11, 12], 1, params, None).tokens == [99]  # the longer match wins


def test_the_conversation_comes_before_the_datastore():
    store = Datastore.from_sequences([[7, 8, 50, 51]])
    drafter = RetrievalDrafter(store)
    assert drafter.propose([7, 8, 9, 3, 7, 8], 3, SamplingParams(), None).tokens == [9, 3, 7]  # copied
    assert drafter.propose([1, 7, 8], 3, SamplingParams(), None).tokens == [50, 51]  # no earlier 8: the store


def test_a_saved_datastore_loads_as_it_was(tmp_path):
    rng = np.random.default_rng(1)
    sequences = [rng.integers(0, 50_000, size=rng.integers(2, 30)).tolist() for _ in range(20)]
    store = Datastore.from_sequences(sequences)
    store.save(tmp_path / "store", {"target": "tiny"})
    loaded = Datastore.load(tmp_path / "store")
    assert np.array_equal(loaded.stream, store.stream)
    for s in sequences:
        assert loaded.next_token(s[:2]) == store.next_token(s[:2])


def test_a_folder_without_a_datastore_is_one_line(tmp_path):
    with pytest.raises(LoadError, match="can't be read") as error:
        Datastore.load(tmp_path)
    assert "\n" not in str(error.value)
    (tmp_path / "config.json").write_text('{"format": "other"}')
    np.savez_compressed(tmp_path / "tokens.npz", stream=np.zeros(3, dtype=np.uint32))
    with pytest.raises(LoadError, match="not a specdec-retrieval datastore"):
        Datastore.load(tmp_path)


def test_a_datastore_of_another_vocabulary_is_refused(smol_tokenizer):
    target = tiny_llama(seed=0, vocab=64)
    with pytest.raises(LoadError, match="past the target's 64"):
        RetrievalDrafter(Datastore.from_sequences([[1, 2, 300]])).bind(target, smol_tokenizer)


def test_greedy_speculation_with_the_target_s_own_replies_is_plain_decoding(smol_tokenizer):
    """A datastore of the target's greedy replies to other prompts (so many drafts are right and
    many wrong): speculative greedy output equals plain decoding, token for token."""
    target = tiny_llama(seed=3, vocab=64)
    plain = SpeculativeEngine(target, smol_tokenizer)
    params = SamplingParams(max_new_tokens=24)
    rng = random.Random(4)
    prompts = [[rng.randrange(64) for _ in range(rng.randrange(3, 9))] for _ in range(16)]
    replies = [plain.generate(prompt, params).token_ids for prompt in prompts]
    store = Datastore.from_sequences(prompt[-2:] + reply for prompt, reply in zip(prompts[:8], replies[:8]))
    engine = SpeculativeEngine(target, smol_tokenizer, drafter=RetrievalDrafter(store), draft_length=4)
    drafted = accepted = 0
    for prompt, reply in zip(prompts, replies):
        result = engine.generate(prompt, params)
        assert result.token_ids == reply
        drafted, accepted = drafted + result.stats.drafted_tokens, accepted + result.stats.accepted_tokens
    assert 0 < accepted < drafted


def test_the_datastore_of_a_work_folder_holds_its_training_replies_only(tiny_train_data, tiny_train_config, tmp_path,
                                                                          smol_tokenizer):
    """train_retrieval on the trainers' tiny data: the stream is each training reply after its
    prompt's last tokens, in the trainers' split (no held-out shard's reply), and the command
    writes a folder the drafter loads; a folder without data is one line."""
    import json

    from specdec_core.drafters.retrieval import PROMPT_TAIL
    from specdec_core.train.data import DataSettings, held_out_shards, read_shard, shard_path
    from specdec_core.train.datastore import build_datastore, main
    from specdec_core.train.dataset import load_sequences

    work = tiny_train_data.parent
    store, about = build_datastore(work, smol_tokenizer)
    recorded = json.loads((tiny_train_data / "data_settings.json").read_text())
    settings = DataSettings(shards=about["shards"], **{k: recorded[k] for k in ("per_shard", "batch_size", "max_new_tokens",
                                                                               "seed", "passages", "prompts")})
    train, heldout = load_sequences(tiny_train_data, settings, smol_tokenizer)
    expected = [s.ids[max(s.reply_start - PROMPT_TAIL, 0):].tolist() for s in train]
    assert np.array_equal(store.stream, Datastore.from_sequences(expected).stream)
    assert about["sequences"] == len(train) > 0 and about["shards"] == len(list(tiny_train_data.glob("shard-*.jsonl")))
    held_replies = {tuple(row["reply_ids"]) for i in held_out_shards(about["shards"])
                    for row in read_shard(shard_path(tiny_train_data, i))}
    assert held_replies and not held_replies & {tuple(s.ids[s.reply_start:].tolist()) for s in train}

    out = tmp_path / "datastore"
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--work", str(work), "--out", str(out)]) == 0
    drafter = RetrievalDrafter.load(out)
    assert np.array_equal(drafter.store.stream, store.stream) and "train_retrieval" in (out / "README.md").read_text()
    assert main(["--preset", "tiny-train", "--config", str(tiny_train_config), "--work", str(tmp_path),
                 "--out", str(tmp_path / "none")]) == 2
