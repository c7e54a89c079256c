"""CachedModel's KV cache: growing in place gives exactly the logits of transformers' own
DynamicCache through forwards, crops and regrowth."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from specdec_core.decoding.eager import CachedModel, GrowingLayer, KeptRunner, cache_kwargs, growing_cache
from tests.tiny_models import tiny_llama, tiny_qwen2


def _stock_logits(model, token_ids: list[int], cache: DynamicCache) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([token_ids]), **cache_kwargs(model, cache), use_cache=True).logits[0].float()


def test_growing_cache_matches_dynamic_cache_exactly_through_crops_and_growth():
    model = tiny_llama(seed=4, init=0.2)
    ours, stock_cache = CachedModel(model), DynamicCache(config=model.config)
    generator = torch.Generator().manual_seed(0)
    steps = [40, 1, 5, 9, 1, 3, 60, 2]  # 40 fills the first room but its spare slot; 60 more makes it regrow
    drop = [0, 0, 3, 6, 0, 2, 10, 1]  # rejected drafts: crop after the forward
    for new, rejected in zip(steps, drop):
        tokens = torch.randint(3, 1000, (new,), generator=generator).tolist()
        torch.testing.assert_close(ours.forward(tokens), _stock_logits(model, tokens, stock_cache), rtol=0, atol=0)
        ours.crop(ours.length - rejected)
        stock_cache.crop(-rejected)
        assert ours.length == stock_cache.get_seq_length()
    assert all(isinstance(layer, GrowingLayer) for layer in ours.cache.layers)
    # room: 41 (the first forward and one spare slot, never filled), doubled to 82 at the 41st
    # token, 164 at the 108th
    assert ours.cache.layers[0]._key_room.shape[-2] == 164 and ours.length == 99


def test_crop_takes_a_negative_count_like_transformers():
    layer = GrowingLayer()
    layer.update(torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))
    layer.crop(0)
    assert layer.get_seq_length() == 5
    layer.crop(-2)
    assert layer.get_seq_length() == 3 and layer.keys.shape == (1, 2, 3, 4)
    with pytest.raises(ValueError, match="negative"):
        layer.crop(1)


def test_sliding_window_layers_stay_as_transformers_builds_them():
    model = tiny_qwen2(seed=2, use_sliding_window=True, sliding_window=16, max_window_layers=1)
    cache = growing_cache(model.config)
    kinds = [type(layer) for layer in cache.layers]
    assert GrowingLayer in kinds and any(kind not in (GrowingLayer, DynamicLayer) for kind in kinds)


def test_kept_runner_crops_to_the_prefix_it_shares_with_the_next_sequence():
    model = tiny_llama(seed=4)
    kept = KeptRunner(CachedModel, model)
    runner = kept.start([1, 2, 3, 4, 5])
    assert runner.length == 0
    runner.forward([1, 2, 3, 4, 5, 6, 7])  # the reply's tokens too, one of them never shown
    kept.finish([1, 2, 3, 4, 5, 6])
    assert runner.length == 6  # what the cache held beyond the sequence is dropped
    assert kept.start([1, 2, 3, 9, 9]) is runner and runner.length == 3  # shares [1, 2, 3]
    runner.forward([9])
    kept.finish([1, 2, 3, 9, 9])
    assert kept.start([1, 2, 3, 9, 9]).length == 4  # the same sequence again: all but its last token
    kept.drop()
    fresh = kept.start([1, 2, 3, 9, 9])
    assert fresh is not runner and fresh.length == 0


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2])
def test_the_cache_reaches_the_model_under_this_transformers(build):
    """A forward through CachedModel fills its cache and gives an uncached forward's logits (a
    keyword the installed transformers doesn't know would run without the cache: wrong logits)."""
    model, tokens = build(seed=3), [5, 6, 7, 8, 9]
    runner = CachedModel(model)
    runner.forward(tokens[:4])
    cached = runner.forward(tokens[4:])
    assert runner.length == 5
    with torch.inference_mode():
        full = model(input_ids=torch.tensor([tokens])).logits[0, -1:].float()
    torch.testing.assert_close(cached, full, rtol=1e-5, atol=1e-5)
