"""SamplingParams validation and the warpers against transformers' own logits processors."""

import pytest
import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specdec_core import SamplingParams
from specdec_core.sampling import make_generator, warp_logits


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
    ],
)
def test_bad_params_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 20, 0.9), (1.3, 5, 1.0), (0.5, 0, 0.5)])
def test_warpers_match_transformers(temperature, top_k, top_p):
    torch.manual_seed(0)
    logits = torch.randn(4, 300) * 3
    expected = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)
    ours = warp_logits(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.equal(torch.isinf(ours), torch.isinf(expected))
    finite = ~torch.isinf(expected)
    assert torch.allclose(ours[finite], expected[finite])


def test_seeded_generators_repeat_and_unseeded_differ():
    a, b = make_generator(7), make_generator(7)
    assert torch.equal(torch.rand(5, generator=a), torch.rand(5, generator=b))
    c, d = make_generator(None), make_generator(None)
    assert not torch.equal(torch.rand(5, generator=c), torch.rand(5, generator=d))
