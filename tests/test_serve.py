"""The API's pure parts, without a server: OpenAI's stop rule, request checking, the stats."""

from __future__ import annotations

import pytest

from specdec_core.events import Stats
from specdec_core.stop_text import StopText
from specdec_core.serve.errors import ApiError
from specdec_core.serve.request import parse_chat_request
from specdec_core.serve.response import speculative, timings


def run(stops: tuple[str, ...], pieces: list[str]) -> tuple[list[str], bool]:
    text = StopText(stops)
    released = [text.push(piece) for piece in pieces]
    if not text.hit:
        released.append(text.flush())
    return released, text.hit


def test_text_without_stop_strings_passes_unchanged():
    assert run((), ["Hel", "lo", " world"]) == (["Hel", "lo", " world", ""], False)


def test_the_reply_ends_before_a_stop_string_that_spans_pieces():
    released, hit = run(("END",), ["one E", "N", "D two"])
    assert hit and "".join(released) == "one "


def test_a_possible_start_is_held_back_until_it_is_not():
    released, hit = run(("</s>",), ["a <", "/", "b> c"])
    assert not hit and released == ["a ", "", "</b> c", ""]


def test_the_earliest_of_several_stop_strings_wins():
    released, hit = run(("xyz", "b"), ["a b xyz"])
    assert hit and released == ["a "]


def test_a_stop_string_at_the_very_start_gives_an_empty_reply():
    released, hit = run(("Hi",), ["Hi there"])
    assert hit and "".join(released) == ""


def body(**fields) -> dict:
    return {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], **fields}


def test_defaults_and_extensions():
    request = parse_chat_request(body(), ["tiny"], default_max_tokens=64)
    assert request.params.temperature == 1.0 and request.params.max_new_tokens == 64
    assert request.params.stop == () and not request.stream and not request.return_sources
    assert request.speculative.drafter is None
    request = parse_chat_request(body(max_tokens=5, max_completion_tokens=7, stop="x", top_k=3, seed=1.0,
                                      speculative={"drafter": "none", "draft_length": 2, "adaptive": False},
                                      stream=True, stream_options={"include_usage": True}), ["tiny"], 64)
    assert request.params.max_new_tokens == 7 and request.params.stop == ("x",) and request.params.top_k == 3
    assert request.params.seed == 1 and request.include_usage and request.stream
    assert (request.speculative.drafter, request.speculative.draft_length, request.speculative.adaptive) == (
        "none", 2, False)
    assert request.speculative.tree_nodes is None
    assert parse_chat_request(body(speculative={"tree_nodes": 0}), ["tiny"], 64).speculative.tree_nodes == 0
    assert parse_chat_request(body(speculative={"tree_nodes": 64}), ["tiny"], 64).speculative.tree_nodes == 64


@pytest.mark.parametrize("fields, param", [
    (dict(temperature=True), "temperature"), (dict(max_tokens=2.5), "max_tokens"), (dict(top_k="3"), "top_k"),
    (dict(stream="yes"), "stream"), (dict(stream_options={"include_usage": 1}), "stream_options.include_usage"),
    (dict(stop=[""]), "stop"), (dict(speculative=[1]), "speculative"), (dict(messages="hi"), "messages"),
    (dict(model=3), "model"), (dict(speculative={"tree_nodes": -1}), "speculative.tree_nodes"),
    (dict(speculative={"tree_nodes": 65}), "speculative.tree_nodes"),
])
def test_bad_types_name_their_field(fields, param):
    with pytest.raises(ApiError) as caught:
        parse_chat_request(body(**fields), ["tiny"], 64)
    assert caught.value.status == 400 and caught.value.param == param and param in caught.value.message


def test_the_stats_follow_vllms_definitions():
    stats = Stats(new_tokens=9, target_forwards=5, wall_s=0.5, ttft_s=0.1)
    for drafted, accepted in ((3, 3), (3, 1), (3, 0), (0, 0)):  # three drafting rounds, one plain
        stats.record_round(drafted, accepted)
    spec = speculative(stats, "model")
    assert spec["acceptance_rate_per_position"] == [2 / 3, 1 / 3, 1 / 3]
    assert spec["mean_acceptance_length"] == pytest.approx(1 + 4 / 3)
    assert spec["acceptance_rate"] == pytest.approx(4 / 9)
    assert (spec["tree_rounds"], spec["tree_nodes_verified"], spec["mean_accepted_depth"]) == (0, 0, 0.0)
    assert timings(stats, prompt_tokens=20) == {
        "prompt_n": 20, "predicted_n": 9, "predicted_ms": 500.0, "predicted_per_token_ms": pytest.approx(500 / 9),
        "predicted_per_second": 18.0, "draft_n": 9, "draft_n_accepted": 4}


def test_tree_rounds_are_counted_by_depth_and_nodes():
    stats = Stats(new_tokens=7, target_forwards=3, wall_s=0.5, ttft_s=0.1)
    stats.record_round(6, 2, tree_depth=3)  # a tree of 6 nodes, 3 deep: a path of 2 kept
    stats.record_round(4, 0, tree_depth=2)
    stats.record_round(2, 2)  # a chain
    spec = speculative(stats, "medusa")
    assert (spec["tree_rounds"], spec["tree_nodes_verified"], spec["mean_accepted_depth"]) == (2, 10, 1.0)
    assert spec["drafted_tokens"] == 12 and spec["accepted_tokens"] == 4
    assert spec["acceptance_rate_per_position"] == [2 / 3, 2 / 3, 0.0]  # positions are depths
