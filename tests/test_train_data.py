"""The trainer's data pipeline on a tiny random target: batched generation on a static cache
writes what one-prompt-at-a-time `generate` writes, token for token, with the features a fresh
forward computes; the same seed gives the same shards; the varied prompt source mixes its
families and keeps prompts built on held-out shards out of training."""

from __future__ import annotations

import json
import random

import pytest
import torch

from specdec_core.kernels.row_attention import use_row_exact_attention
from specdec_core.train.batch_generate import PREFILL_ROWS, generate_batch
from specdec_core.train.data import GENERATOR, DataSettings, eos_ids, features_path, generate_data, read_shard, shard_path
from specdec_core.train.dataset import load_sequences
from specdec_core.train.features import sequence_features
from specdec_core.train.prompt_sets import everyday_prompts, replies_to
from specdec_core.train.varied import clean_request, is_new
from tests.tiny_models import tiny_llama

LAYERS = (0, 1, 1)


@pytest.fixture(scope="module")
def tiny():
    return tiny_llama(seed=5, init=0.2).eval()


def _prompts(count: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(10, 40000) for _ in range(rng.randint(2, 25))] for _ in range(count)]


def _alone(model, prompt: list[int], eos: list[int], new: int) -> list[int]:
    out = model.generate(torch.tensor([prompt]), max_new_tokens=new, do_sample=False, eos_token_id=eos, pad_token_id=0)
    reply = out[0, len(prompt):].tolist()
    return reply[: next((i + 1 for i, t in enumerate(reply) if t in eos), len(reply))]


@pytest.mark.parametrize("attention", ["sdpa", "row_exact"])
def test_a_batch_writes_what_one_prompt_at_a_time_writes_with_a_fresh_forwards_features(tiny, attention):
    """Also with the 4-bit target's row-exact attention, whose one-row steps attend to every
    key unmasked: a batch down to its last writing row once read that row's left padding."""
    if attention == "row_exact":
        tiny = tiny_llama(seed=5, init=0.2).eval()
        assert use_row_exact_attention(tiny) is None
    prompts, new = _prompts(3 * PREFILL_ROWS + 5), 20  # the prompts are read in four chunks
    # eos: a token each other row writes early and the first row never writes, so rows finish at
    # different steps and leave the batch, and the first one writes its last tokens alone.
    free = [_alone(tiny, p, [], new) for p in prompts]
    eos = sorted({next((t for t in reply[:15] if t not in free[0]), free[0][0]) for reply in free[1:]} - set(free[0]))
    replies, features = generate_batch(tiny, prompts, max_new_tokens=new, eos=eos, pad=0, layer_ids=LAYERS)
    assert [len(r) for r in replies] != [new] * len(prompts)  # some rows did finish early
    assert sorted(len(r) for r in replies)[-2] < new  # and one row wrote its last tokens alone
    for prompt, reply, feature in zip(prompts, replies, features):
        assert reply == _alone(tiny, prompt, eos, new)
        aux, final = sequence_features(tiny, (prompt + reply)[:-1], LAYERS)
        assert feature["aux"].shape == aux.shape and feature["final"].shape == final.shape
        assert torch.allclose(feature["aux"].float(), aux.float(), atol=2e-3, rtol=1e-2)
        assert torch.allclose(feature["final"].float(), final.float(), atol=2e-3, rtol=1e-2)


def test_sampled_batches_follow_the_seed(tiny):
    prompts = _prompts(6, seed=1)

    def sample(seed):
        return generate_batch(tiny, prompts, max_new_tokens=12, eos=[], pad=0, temperature=1.0, seed=seed)[0]

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)


def _varied(tmp_path, tiny, tokenizer, folder: str, shards: int, seed: int = 0):
    settings = DataSettings(shards=shards, per_shard=24, batch_size=12, max_new_tokens=8, seed=seed, prompts="varied")
    generate_data(lambda: tiny, tokenizer, tmp_path / folder, settings, LAYERS)
    return settings


def test_the_same_seed_writes_the_same_shards(tmp_path, tiny, smol_tokenizer):
    for folder in ("a", "b"):
        _varied(tmp_path, tiny, smol_tokenizer, folder, shards=2)
    for index in range(2):
        assert shard_path(tmp_path / "a", index).read_text() == shard_path(tmp_path / "b", index).read_text()
        first, second = (torch.load(features_path(tmp_path / f, index)) for f in ("a", "b"))
        assert all(torch.equal(x["aux"], y["aux"]) for x, y in zip(first, second))
    _varied(tmp_path, tiny, smol_tokenizer, "c", shards=2, seed=1)
    assert shard_path(tmp_path / "c", 1).read_text() != shard_path(tmp_path / "a", 1).read_text()


def test_a_shard_kept_without_its_features_gets_them_again_from_forwards(tmp_path, tiny, smol_tokenizer):
    """Token files are kept where features (100x larger) are not: a rerun computes a missing
    features file again, the same features generation captured, and leaves the tokens alone."""
    settings = _varied(tmp_path, tiny, smol_tokenizer, "data", shards=2)
    data = tmp_path / "data"
    tokens, captured = shard_path(data, 1).read_text(), torch.load(features_path(data, 1))
    features_path(data, 1).unlink()
    generate_data(lambda: tiny, smol_tokenizer, data, settings, LAYERS)
    assert shard_path(data, 1).read_text() == tokens
    replayed = torch.load(features_path(data, 1))
    assert len(replayed) == len(captured) == len(read_shard(shard_path(data, 1)))
    for again, first in zip(replayed, captured):
        for key in ("aux", "final"):
            assert again[key].shape == first[key].shape
            assert torch.allclose(again[key].float(), first[key].float(), atol=2e-3, rtol=1e-2)


def test_varied_shards_mix_their_families_and_keep_held_out_conversations_out_of_training(tmp_path, tiny, smol_tokenizer):
    settings = _varied(tmp_path, tiny, smol_tokenizer, "data", shards=10)
    rows = [row for index in range(10) for row in read_shard(shard_path(tmp_path / "data", index))]
    families = {row["family"] for row in rows}
    assert {"code", "multi_turn"} <= families and families & {"summarization", "rewriting", "rag", "translation"}
    second_turns = [row for row in rows if row["family"] == "multi_turn"]
    assert all(len(row["history"]) == 2 and row["from_shard"] is not None for row in second_turns)
    shard9 = read_shard(shard_path(tmp_path / "data", 9))
    assert any(row.get("from_shard") == 8 for row in shard9)  # shard 8 is held out
    train, heldout = load_sequences(tmp_path / "data", settings, smol_tokenizer)
    assert heldout and all(s.from_shard != 8 for s in train)
    built_on_held = sum(row.get("from_shard") == 8 and len(row["reply_ids"]) >= 3 for row in shard9)
    assert built_on_held and len(train) == sum(len(row["reply_ids"]) >= 3 for row in rows) - len(heldout) - built_on_held


def test_a_request_the_target_writes_is_kept_only_when_it_reads_as_a_new_request():
    assert clean_request(" Request: How do I keep basil alive on a windowsill? ") == "How do I keep basil alive on a windowsill?"
    assert clean_request("Sure! Here is a new request for the assistant.") is None
    assert clean_request("and then the") is None  # unfinished
    assert clean_request("上終萬物布目限 Cant Throw Rare Plates Head-butting 什麻.") is None
    seen: set = set()
    assert is_new("How do I keep basil alive on a windowsill?", seen)
    assert not is_new("how do I keep basil alive on a sunny windowsill?", seen)
    assert is_new("What is the best way to learn to juggle?", seen)


def test_rows_of_a_varied_shard_say_what_the_next_shard_reads(tmp_path, tiny, smol_tokenizer):
    _varied(tmp_path, tiny, smol_tokenizer, "data", shards=1)
    recipe = json.loads((tmp_path / "data" / "data_settings.json").read_text())
    assert recipe["prompts"] == "varied" and recipe["generator"] == GENERATOR
    assert all(row["text"] for row in read_shard(shard_path(tmp_path / "data", 0)))


def test_a_prompt_sets_replies_are_written_once_and_measured_as_greedy_held_out_replies(tmp_path, tiny, smol_tokenizer):
    prompts = [("chat", "How are you today?"), ("code", "Write a Python function that adds two numbers.")]
    written = replies_to("everyday", prompts, tiny, smol_tokenizer, tmp_path, LAYERS, max_new_tokens=6)
    assert [s.family for s in written] == ["chat", "code"] and all(s.mode == "greedy" for s in written)
    for sequence in written:
        assert sequence.aux.shape == (len(sequence.ids) - 1, 3 * tiny.config.hidden_size)
        reply = sequence.ids[sequence.reply_start :].tolist()
        assert reply == _alone(tiny, sequence.ids[: sequence.reply_start].tolist(), eos_ids(tiny, smol_tokenizer), 6)
    # Read back, not written again (no target to write with); other prompts are written anew.
    again = replies_to("everyday", prompts, None, smol_tokenizer, tmp_path, LAYERS, max_new_tokens=6)
    assert [s.ids.tolist() for s in again] == [s.ids.tolist() for s in written]
    other = replies_to("everyday", prompts[:1], tiny, smol_tokenizer, tmp_path, LAYERS, max_new_tokens=6)
    assert len(other) == 1


def test_the_everyday_prompts_load_with_their_categories():
    prompts = everyday_prompts()
    assert len(prompts) >= 50 and {"chat", "code"} <= {category for category, _ in prompts}
    assert all(text.strip() for _, text in prompts)
