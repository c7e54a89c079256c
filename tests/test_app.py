"""End to end: the chat app served on a local port, driven by gradio_client, on tiny models.

The tiny presets (tests/conftest.py: tiny_app_config) load through the real loading path.
Each test uses its own Client, so its own session: its own chat history.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from gradio_client import Client
from gradio_client.exceptions import AppError
from gradio_client.utils import Status

import app
from specdec_app import render as R
from specdec_app.settings import CONTROLS
from specdec_core import SamplingParams
from specdec_core.chat import chat_prompt_ids
from tests.conftest import TREE_MESSAGE, free_port

from tests.device_watch import assert_no_more_forwards, forwards_of

REPO = Path(__file__).resolve().parents[1]
SPAN = re.compile(r'<span class="tok tok-(\w+)" style="[^"]*">(.*?)</span>', re.S)
OUT = ["msg", "chat", "chat_baseline", "stats", "plot", "speedup", "models",  # client outputs
       "live", "race", "history", "history_csv", "tree"]

DEFAULTS = dict(preset="tiny", drafter="prompt_lookup", temperature=0.0, top_p=1.0, top_k=0,
                max_new_tokens=24, draft_length=4, adaptive=True, baseline=False, compare=False)


def controls(**overrides) -> list:
    """The control values in the order the chat events take them (specdec_app.settings.CONTROLS)."""
    values = {**DEFAULTS, **overrides}
    return [values[name] for name in CONTROLS]


def send(client: Client, message: str, **overrides):
    return client.submit(message, *controls(**overrides), api_name="/send")


def outputs(job) -> dict:
    return dict(zip(OUT, job.result()))


def text_of(message: dict) -> str:
    """A chatbot message's content as the HTML string the app sent."""
    content = message["content"]
    return content if isinstance(content, str) else "".join(block["text"] for block in content)


def token_spans(message: dict) -> list[tuple[str, str]]:
    """(source, exact text) of each token span of a chatbot message."""
    return [(source, html.unescape(text)) for source, text in SPAN.findall(text_of(message))]


def reference_reply(server, messages: list[dict], drafter: str = "none", max_new_tokens: int = 24):
    """What the engine itself generates for this conversation (greedy)."""
    models = server.holder.models
    prompt = chat_prompt_ids(models.tokenizer, messages)
    return models.make_engine(drafter=drafter).generate(prompt, SamplingParams(max_new_tokens=max_new_tokens))


@pytest.fixture
def client(app_server):
    return Client(app_server.url, verbose=False)


def test_import_and_build_load_nothing(tiny_app_config):
    holder = app.ModelHolder(str(tiny_app_config))
    demo = app.build_ui("tiny", str(tiny_app_config), holder=holder)
    assert holder.models is None
    assert not demo.is_running
    ids = {block.elem_id for block in demo.blocks.values()}
    assert {"msg", "send", "stop", "chat", "chat-baseline", "baseline", "compare", "stats", "speedup"} <= ids


def test_reply_streams_as_coloured_exact_tokens(app_server, client):
    job = send(client, "Tell me a <story> & *more*")
    updates = [dict(zip(OUT, update)) for update in job]
    final = outputs(job)
    assert updates[0]["msg"] == ""  # the box is cleared for the next message, at once
    assert final["msg"] == {"__type__": "update"}  # and then left alone
    user, reply = final["chat"]
    assert "&lt;story&gt; &amp; *more*" in text_of(user)
    spans = token_spans(reply)
    assert spans and all(source in ("draft", "resampled", "bonus", "target") for source, _ in spans)
    # The spans carry exactly the engine's text: escaping and colouring changed nothing.
    expected = reference_reply(app_server, [{"role": "user", "content": "Tell me a <story> & *more*"}])
    assert "".join(text for _, text in spans) == expected.text
    # It streamed: the reply grew over several updates before the end.
    lengths = {len(token_spans(u["chat"][-1])) for u in updates if len(u["chat"]) == 2}
    assert len(lengths) >= 2
    assert "done" in final["stats"] and "Tokens/s" in final["stats"]
    assert "Acceptance rate" in final["stats"] and "Draft length now" in final["stats"]
    assert "target: ./target" in final["models"]


def test_multi_turn_prompt_uses_the_plain_text_history(app_server, client):
    first = outputs(send(client, "Hello there"))
    first_reply = "".join(text for _, text in token_spans(first["chat"][1]))
    second = outputs(send(client, "And then?"))
    assert [m["role"] for m in second["chat"]] == ["user", "assistant", "user", "assistant"]
    conversation = [{"role": "user", "content": "Hello there"},
                    {"role": "assistant", "content": first_reply},
                    {"role": "user", "content": "And then?"}]
    second_reply = "".join(text for _, text in token_spans(second["chat"][3]))
    assert second_reply == reference_reply(app_server, conversation).text


def test_model_drafter_shows_draft_provenance(client):
    # adaptive=False: every round drafts (the adaptive engine may decode plainly where the
    # tiny draft, as slow as its target, does not pay).
    final = outputs(send(client, "Count with me: one two three", drafter="model", max_new_tokens=40,
                         adaptive=False))
    sources = {source for source, _ in token_spans(final["chat"][1])}
    assert "draft" in sources  # the perturbed copy agrees with the target often
    assert sources <= {"draft", "resampled", "bonus", "target"}
    assert "speculative · draft model" in final["stats"]
    plot = final["plot"]
    assert plot["columns"][:2] == ["position", "acceptance"] and plot["data"]


def test_baseline_toggle_decodes_plainly(app_server, client):
    final = outputs(send(client, "Plain please", baseline=True))
    spans = token_spans(final["chat"][1])
    assert spans and {source for source, _ in spans} == {"target"}
    assert "**baseline**" in final["stats"] and "Acceptance" not in final["stats"]
    assert "".join(t for _, t in spans) == reference_reply(app_server, [{"role": "user", "content": "Plain please"}]).text


def test_side_by_side_runs_baseline_then_speculative(client):
    final = outputs(send(client, "Compare us", compare=True, drafter="model", adaptive=False))
    base_spans = token_spans(final["chat_baseline"][1])
    spec_spans = token_spans(final["chat"][1])
    assert {s for s, _ in base_spans} == {"target"}
    assert {s for s, _ in spec_spans} - {"target"}  # speculation shows its provenance
    assert "".join(t for _, t in base_spans) == "".join(t for _, t in spec_spans)  # greedy: lossless
    assert SIDE_BY_SIDE.search(final["speedup"])
    assert "outputs identical ✓" in final["speedup"]


SIDE_BY_SIDE = re.compile(r"\*\*Speedup: (\d+\.\d\d)× end to end · (\d+\.\d\d)× decode phase\*\*")
READING = re.compile(r"Time to first token: baseline ([\d.]+) (ms|s) · speculative ([\d.]+) (ms|s)")
READ_ALIKE = re.compile(r"both read (\d+) prompt tokens")
RATES = re.compile(r"\(end to end: speculative ([\d.]+) tok/s vs baseline ([\d.]+) tok/s; "
                   r"after the first token: ([\d.]+) vs ([\d.]+) tok/s\)")
LONG_PRESET = """\
auto_fallback: tiny-long
presets:
  tiny-long:
    description: a tiny random Llama with room for a long prompt
    target: ./target
    drafter: prompt_lookup
    draft_length: 4
    memory_gb: 0.1
"""


@pytest.fixture(scope="module")
def long_context_server(tmp_path_factory, smol_tokenizer):
    """The app on a tiny target with a 2048-token context (the app tests' tiny preset has 512),
    wider and deeper so that reading a long prompt takes a measurable time."""
    from types import SimpleNamespace

    from tests.tiny_models import tiny_llama

    folder = tmp_path_factory.mktemp("long-preset")
    target = tiny_llama(seed=0, init=0.2, hidden_size=128, intermediate_size=256, num_hidden_layers=4)
    target.config.max_position_embeddings = 2048  # rotary positions: nothing sized by it
    target.save_pretrained(folder / "target")
    smol_tokenizer.save_pretrained(folder / "target")
    (folder / "models.yaml").write_text(LONG_PRESET)
    holder = app.ModelHolder(str(folder / "models.yaml"))
    demo = app.build_ui("tiny-long", str(folder / "models.yaml"), max_new_tokens=16, holder=holder)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield SimpleNamespace(url=demo.local_url, holder=holder)
    demo.close()
    holder.release()


def seconds_of(value: str, unit: str) -> float:
    return float(value) / (1000 if unit == "ms" else 1)


@pytest.mark.parametrize("long_prompt", [False, True], ids=["short prompt", "long prompt"])
def test_side_by_side_reads_the_prompt_alike_in_both_halves(long_context_server, smol_tokenizer, long_prompt):
    """Both halves read the same prompt tokens from the same cache state (the pane says how many,
    as each half's engine counted them), their times to first token are of the same order, each
    speedup is the ratio of the rates it is shown with, and greedy stays identical. (The
    end-to-end speedup also lay between 1 and the decode-phase one, but on replies of 16 tokens
    one scheduler stall decides that: CI's two workers once stalled a short prompt's 1-token
    read by about 125 ms, and a baseline of 209 ms showed 2.60x end to end against 1.06x.)"""
    words = "the river carries salt and stone past seven quiet towns where lamps burn late".split()
    message = " ".join(words[(i * 5) % len(words)] for i in range(800)) if long_prompt else "Say something."
    prompt = chat_prompt_ids(smol_tokenizer, [{"role": "user", "content": message}])
    assert (len(prompt) >= 800) == long_prompt
    client = Client(long_context_server.url, verbose=False)
    for turn in range(2):  # a fresh cache, then one that holds the previous conversation
        final = outputs(client.submit(message, *controls(preset="tiny-long", compare=True, max_new_tokens=16),
                                      api_name="/send"))
        end_to_end, decode = map(float, SIDE_BY_SIDE.search(final["speedup"]).groups())
        base_ttft, base_unit, spec_ttft, spec_unit = READING.search(final["speedup"]).groups()
        base_ttft, spec_ttft = seconds_of(base_ttft, base_unit), seconds_of(spec_ttft, spec_unit)
        read = int(READ_ALIKE.search(final["speedup"]).group(1))  # the same count on both sides
        assert read > 0 and (read > 700 or turn or not long_prompt), final["speedup"]  # read whole at first
        # the same order: within a factor of 3 (or 200 ms apart: a scheduler's stall on a shared
        # machine; CI's two workers stalled a 1-token read 79 ms once, 125 ms another time);
        # unfairly read, the long prompt's were 122 ms and 6 ms (1.78x end to end, 1.09x decode)
        assert max(base_ttft, spec_ttft) <= 3 * min(base_ttft, spec_ttft) + 0.2, final["speedup"]
        spec_rate, base_rate, spec_decode, base_decode = map(float, RATES.search(final["speedup"]).groups())
        assert end_to_end == pytest.approx(spec_rate / base_rate, rel=0.02, abs=0.01), final["speedup"]
        assert decode == pytest.approx(spec_decode / base_decode, rel=0.02, abs=0.01), final["speedup"]
        assert "outputs identical ✓" in final["speedup"]
        spec_text = "".join(t for _, t in token_spans(final["chat"][-1]))
        assert spec_text == "".join(t for _, t in token_spans(final["chat_baseline"][-1]))
        client = Client(long_context_server.url, verbose=False)  # a new conversation, the cache kept
        row = dict(zip(final["history"]["headers"], final["history"]["data"][-1]))
        assert row["end-to-end speedup"] == end_to_end and row["decode speedup"] == decode


def race_runs(race: dict) -> dict[str, list]:
    """The race chart's (seconds, tokens) points by series."""
    x, y, run = (race["columns"].index(name) for name in ("seconds", "tokens", "run"))
    points: dict[str, list] = {}
    for row in race["data"]:
        points.setdefault(row[run], []).append((row[x], row[y]))
    return points


def test_live_speedup_race_and_history_of_a_speculative_reply(client):
    job = send(client, "Repeat after me: red green blue, red green blue", max_new_tokens=40)
    updates = [dict(zip(OUT, update)) for update in job]
    final = outputs(job)
    # Every streamed update carries the live figure, compared with a measured plain rate.
    live = [u["live"] for u in updates if u["live"] and "Speedup now" in u["live"]]
    assert len(live) >= 2
    assert re.search(r"\*\*Speedup now: \d+\.\d\d×\*\* · [\d.]+ tok/s vs plain decoding [\d.]+ tok/s, measured ",
                     final["live"])
    assert "Predicted (Leviathan et al.)" in final["live"]
    runs = race_runs(final["race"])
    spec = runs["speculative"]
    tokens = int(re.search(r"(\d+) tokens · done", final["stats"]).group(1))
    assert spec[0] == (0.0, 0) and spec[-1][1] == tokens and len(spec) >= 2
    # the measured rate's straight line, from the reply's first point on (after the origin)
    line = runs["baseline (measured rate)"]
    assert len(line) == 3 and line[1] == spec[1] and line[2][0] == spec[-1][0]
    history = final["history"]
    assert history["headers"][:5] == ["#", "prompt", "mode", "drafter", "tokens"]
    assert len(history["data"]) == 1 and history["data"][0][2:4] == ["speculative", "prompt lookup"]
    second = outputs(send(client, "Once more", baseline=True))
    assert [row[0] for row in second["history"]["data"]] == [1, 2]
    assert second["history"]["data"][1][3] == "none"
    assert second["live"].startswith("**Baseline reply**")
    assert {run for run, points in race_runs(second["race"]).items() if len(points) > 1} == {"baseline"}
    with open(second["history_csv"], encoding="utf-8") as file:
        lines = file.read().splitlines()
    assert lines[0].startswith("#,prompt,mode,drafter,tokens,acceptance") and len(lines) == 3
    # The next speculative reply compares with the baseline reply just measured.
    third = outputs(send(client, "And again"))
    assert "measured in a baseline reply" in third["live"]


def test_side_by_side_races_two_real_runs_and_shows_the_speedup_while_streaming(client):
    job = send(client, "Race us", compare=True, max_new_tokens=80)
    updates = [dict(zip(OUT, update)) for update in job]
    final = outputs(job)
    so_far = [u["speedup"] for u in updates if u["speedup"] and "Speedup so far" in u["speedup"]]
    assert so_far, "no speedup while the speculative half streamed"
    runs = race_runs(final["race"])
    assert len(runs["speculative"]) >= 2 and len(runs["baseline"]) >= 2
    assert runs["speculative"][-1][1] == runs["baseline"][-1][1]  # greedy: the same tokens, raced
    assert "measured in side-by-side just now" in final["live"]
    assert final["history"]["data"][-1][2] == "side by side"


def test_baseline_pane_keeps_every_turn(client):
    outputs(send(client, "First"))
    outputs(send(client, "Second"))
    final = outputs(send(client, "Third", compare=True))
    pane = final["chat_baseline"]
    assert [m["role"] for m in pane] == ["user", "assistant"] * 3
    assert [R.NO_BASELINE in text_of(m) for m in pane[1::2]] == [True, True, False]
    assert [text_of(m).endswith(f"{word}</span>") for m, word in zip(pane[::2], ("First", "Second", "Third"))] == [True] * 3


def test_side_by_side_sampling_says_outputs_differ_by_design(client):
    final = outputs(send(client, "Sample", compare=True, temperature=0.9, top_p=0.9, top_k=50))
    assert "Speedup:" in final["speedup"] and "by design" in final["speedup"]


def start_long_reply(client, forwards):
    """A baseline reply long enough to stop midway; returns once 20 target forwards have run and
    the client has been streamed a view with reply tokens (before that, the session's history
    holds no reply yet, and Stop rightly says it stopped before the reply started)."""
    job = send(client, "Go on and on", baseline=True, max_new_tokens=450)
    while len(forwards) < 20 or not _reply_streamed(job.outputs()[-1:]):
        assert not job.done(), "the generation ended before it could be stopped"
        time.sleep(0.01)
    return job


def _reply_streamed(latest: list) -> bool:
    """Whether the latest streamed view (none yet: []) shows reply tokens; every later one does too."""
    chat = dict(zip(OUT, latest[0]))["chat"] if latest else []
    return bool(chat) and chat[-1]["role"] == "assistant" and bool(token_spans(chat[-1]))


def test_stop_ends_the_work_and_the_next_message_works(app_server, client):
    with forwards_of(app_server.holder.get("tiny").target) as forwards:
        start_long_reply(client, forwards).cancel()
        assert_no_more_forwards(forwards, after="Stop")
    after = outputs(send(client, "Still there?"))
    roles = [m["role"] for m in after["chat"]]
    assert roles[-2:] == ["user", "assistant"] and token_spans(after["chat"][-1])
    assert text_of(after["chat"][-2]).endswith("Still there?</span>")


def test_stop_button_ends_the_engine_within_one_round(app_server, client):
    with forwards_of(app_server.holder.get("tiny").target) as forwards:
        job = start_long_reply(client, forwards)
        panel, *_ = client.predict("x · generating…", "", api_name="/stop")  # what the Stop button calls
        at_stop = len(forwards)
        while not job.done():
            time.sleep(0.01)
        time.sleep(0.5)
        # Baseline rounds are one forward each: at most the round in flight finishes.
        assert len(forwards) - at_stop <= 1, "the engine ran on after Stop"
    assert panel == "x · stopped"
    after = outputs(send(client, "Next"))
    assert [m["role"] for m in after["chat"]] == ["user", "assistant", "user", "assistant"]
    assert token_spans(after["chat"][1])  # the stopped reply stays in the history


def test_a_cancelled_reply_never_overlaps_the_next(app_server):
    """gradio frees the queue slot on cancel before the cancelled generator's step ends;
    the device lock keeps the next reply from running model steps alongside it."""
    target = app_server.holder.get("tiny").target
    running, overlaps, forwards = [0], [], []

    def before(*_):
        running[0] += 1
        overlaps.append(running[0])
        forwards.append(1)

    def after(*_):
        running[0] -= 1

    hooks = [target.register_forward_pre_hook(before), target.register_forward_hook(after)]
    try:
        for _ in range(3):
            first, second = Client(app_server.url, verbose=False), Client(app_server.url, verbose=False)
            job = send(first, "Long", baseline=True, max_new_tokens=400)
            start = len(forwards)
            while len(forwards) < start + 10:
                time.sleep(0.005)
            waiting = send(second, "Next", max_new_tokens=8)  # queued behind the long one
            while waiting.status().code != Status.IN_QUEUE:
                time.sleep(0.005)
            job.cancel()  # the queued reply starts at once
            assert token_spans(outputs(waiting)["chat"][1])
    finally:
        for hook in hooks:
            hook.remove()
    assert max(overlaps) == 1


def test_retry_replaces_the_last_reply_and_clear_empties(client):
    # Fixed draft length: with adaptive drafting the rounds (and so the sources) follow measured
    # timings, which a busy machine changes between the two replies; the text would still match.
    first = outputs(send(client, "Once", adaptive=False))
    again = dict(zip(OUT, client.predict(*controls(adaptive=False), api_name="/retry")))
    assert len(again["chat"]) == 2
    assert token_spans(again["chat"][1]) == token_spans(first["chat"][1])  # greedy: the same reply
    cleared = client.predict(api_name="/clear")
    assert cleared[1] == [] and cleared[2] == []
    with pytest.raises(AppError, match="Nothing to retry"):
        client.predict(*controls(), api_name="/retry")


def test_clear_during_a_reply_stops_it_and_the_history_stays_empty(client):
    outputs(send(client, "An earlier turn"))
    job = send(client, "Go on and on", baseline=True, max_new_tokens=450)
    while len(job.outputs()) < 3:
        time.sleep(0.01)
    cleared = client.predict(api_name="/clear")
    assert cleared[1] == []
    while not job.done():
        time.sleep(0.01)
    after = outputs(send(client, "Fresh start"))
    assert [m["role"] for m in after["chat"]] == ["user", "assistant"]  # nothing came back


def test_second_user_waits_in_the_queue(app_server):
    first, second = Client(app_server.url, verbose=False), Client(app_server.url, verbose=False)
    long_job = send(first, "Long one", baseline=True, max_new_tokens=300)
    while long_job.status().code not in (Status.PROCESSING, Status.ITERATING):
        time.sleep(0.01)
    waiting = send(second, "My turn")
    ranks = []
    while not waiting.done():
        status = waiting.status()
        if status.code == Status.IN_QUEUE and status.rank is not None:
            ranks.append(status.rank)
        time.sleep(0.02)
    assert ranks and ranks[0] == 0  # told its position while the first generation ran
    assert long_job.done() and token_spans(outputs(waiting)["chat"][1])


def test_preset_menu_swaps_models_and_frees_the_old_ones(app_server, client):
    old = app_server.holder.get("tiny")
    models_text, name, drafter, draft_length, adaptive = client.predict("tiny-nodraft", api_name="/load_preset")
    assert (name, drafter, draft_length, adaptive) == ("tiny-nodraft", "prompt_lookup", 5, True)
    assert old.target is None and old.draft is None  # unloaded before the new preset loaded
    assert "target: ./target" in models_text and "draft:" not in models_text
    assert app_server.holder.models.preset.name == "tiny-nodraft"
    _, name, *_ = client.predict("tiny", api_name="/load_preset")
    assert name == "tiny" and app_server.holder.models.draft is not None


# ---------------------------------------------------------------- errors: message, history intact


def assert_history_kept(client, turns_before: int):
    final = outputs(send(client, "after the error"))
    assert len(final["chat"]) == 2 * turns_before + 2


def test_empty_message_is_refused_with_advice(client):
    outputs(send(client, "first"))
    with pytest.raises(AppError, match="Empty message: type something"):
        send(client, "   ").result()
    assert_history_kept(client, 1)


def test_prompt_longer_than_context_is_refused_with_advice(client):
    outputs(send(client, "first"))
    with pytest.raises(AppError, match=r"more than the model's context of 512: press Clear"):
        send(client, "word " * 600).result()
    assert_history_kept(client, 1)


def test_failed_load_shows_what_to_do_and_the_app_recovers(app_server, client):
    outputs(send(client, "first"))
    with pytest.raises(AppError, match="no model folder"):
        client.predict("broken", api_name="/load_preset")
    with pytest.raises(AppError, match="no model folder"):
        send(client, "via send", preset="broken").result()
    assert_history_kept(client, 1)  # and the tiny preset loads again


def test_out_of_memory_shows_what_to_do(app_server, client, monkeypatch):
    outputs(send(client, "first"))
    models = app_server.holder.get("tiny")
    real_engine = models.engine

    class RunsOutOfMemory:
        def __init__(self, engine):
            self.engine, self.stats = engine, engine.stats

        def __getattr__(self, name):  # the rest is the engine's
            return getattr(self.engine, name)

        def stream(self, prompt_ids, params):
            for n, event in enumerate(self.engine.stream(prompt_ids, params)):
                if n == 3:
                    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
                self.stats = self.engine.stats
                yield event

    monkeypatch.setattr(models, "engine", lambda **kw: RunsOutOfMemory(real_engine(**kw)))
    job = send(client, "this runs out")
    with pytest.raises(AppError, match="Out of memory: lower 'max new tokens'"):
        job.result()
    restored = dict(zip(OUT, job.outputs()[-1]))
    assert len(restored["chat"]) == 2 and restored["msg"] == "this runs out"
    monkeypatch.undo()
    assert_history_kept(client, 1)


def test_out_of_range_setting_is_refused(client):
    # The sliders' bounds keep bad values from the engine; gradio names the problem.
    with pytest.raises(AppError, match="less than minimum value 0.05"):
        send(client, "hi", top_p=0.0).result()


@pytest.mark.parametrize("drafter", ["eagle", "hybrid", "medusa"])
def test_eagle_hybrid_and_medusa_drafters_give_the_engines_reply(client, app_server, drafter):
    final = outputs(send(client, "Count with me: one two three", drafter=drafter, max_new_tokens=24))
    spans = token_spans(final["chat"][1])
    expected = reference_reply(app_server, [{"role": "user", "content": "Count with me: one two three"}])
    assert "".join(text for _, text in spans) == expected.text
    assert "eagle head: ./eagle" in final["models"] and "draft vocabulary 2,048" in final["models"]
    assert "medusa heads: ./medusa" in final["models"] and "3 heads of 1 residual block(s)" in final["models"]


def tree_view_nodes(markup: str) -> list[tuple[str, str, str]]:
    """(li class, chip class, shown text) of every item of the #tree view, in document order."""
    import xml.etree.ElementTree as ET

    return [(li.get("class"), li[0].get("class"), "".join(li[0].itertext()))
            for li in ET.fromstring(markup).iter("li")]


@pytest.mark.parametrize("drafter", ["medusa", "eagle"])
def test_a_tree_reply_shows_its_last_tree_round_and_the_tree_size(tree_app_server, drafter):
    """Medusa's candidate trees (heads fitted to this reply: paths are kept) and EAGLE's dynamic
    trees (a random head: all but always rejected) on the tiny preset: #tree draws the engine's
    last tree round (every node, the kept path in the draft colour, the target's own token in its
    source's, the rest rejected), the panel gives the trees' size and the live theory line
    predicts from the per-node acceptance; a chain reply after it clears the view."""
    client = Client(tree_app_server.url, verbose=False)
    final = outputs(send(client, TREE_MESSAGE, drafter=drafter, adaptive=False, max_new_tokens=24))
    engine = tree_app_server.holder.models.engine(drafter=drafter, draft_length=4, adaptive=False)
    tree, tokenizer = engine.stats.last_tree, engine.tokenizer
    assert tree is not None and engine.stats.tree_rounds > 0
    if drafter == "medusa":
        assert engine.stats.tree_accepted_depth > 0 and tree.path  # the view has a kept path to show
    expected = reference_reply(tree_app_server, [{"role": "user", "content": TREE_MESSAGE}])
    assert "".join(text for _, text in token_spans(final["chat"][1])) == expected.text  # trees stay lossless
    items = tree_view_nodes(final["tree"])
    nodes = [item for item in items if "tree-node" in item[0]]
    assert sorted(text for _, _, text in nodes) == sorted(R.tree_text(tokenizer.decode([t])) for t in tree.tokens)
    kept = [text for cls, _, text in nodes if "tree-kept" in cls]
    assert kept == [R.tree_text(tokenizer.decode([tree.tokens[n]])) for n in tree.path]
    assert all(chip == "tok tok-draft" for cls, chip, _ in nodes if "tree-kept" in cls)
    assert all(chip == "tree-rejected" for cls, chip, _ in nodes if "tree-kept" not in cls)
    assert len(nodes) - len(kept) >= 1  # a tree: some branch was not kept
    [(_, closing, text)] = [item for item in items if "tree-target" in item[0]]
    assert closing == f"tok tok-{tree.source}" and tree.source in ("bonus", "resampled")
    assert text == R.tree_text(tokenizer.decode([tree.token]))
    assert f"| Tree size (nodes verified) | {len(tree.tokens)} in the last tree round · " in final["stats"]
    assert "Predicted (trees, per-node acceptance)" in final["live"]
    # the next reply verifies chains: its first update clears the view
    updates = [dict(zip(OUT, update)) for update in send(client, "And now?", drafter="prompt_lookup")]
    assert updates[0]["tree"] == "" and "Tree size" not in updates[-1]["stats"]


def test_side_by_side_with_trees_is_lossless_and_predicted_from_the_trees(tree_app_server):
    """Side by side with Medusa's trees: the same greedy text in both panes, the tree view of the
    speculative half, and the live line priced by the per-node acceptance (every round drafted a
    tree: the plain step comes from the baseline half's engine, same target)."""
    client = Client(tree_app_server.url, verbose=False)
    final = outputs(send(client, TREE_MESSAGE, compare=True, drafter="medusa", adaptive=False))
    base = "".join(text for _, text in token_spans(final["chat_baseline"][1]))
    assert base == "".join(text for _, text in token_spans(final["chat"][1]))
    assert "outputs identical ✓" in final["speedup"]
    assert {cls for cls, _, _ in tree_view_nodes(final["tree"])} >= {"tree-node tree-path tree-kept", "tree-path tree-target"}
    assert "Predicted (trees, per-node acceptance)" in final["live"]


def test_layer_skip_drafter_gives_the_engines_reply_and_shows_its_calibration(client, app_server):
    """The menu's "self-speculative (layer skip)": the reply is the engine's, and the models panel
    shows what the calibration chose (or that no subset pays) with its numbers."""
    from specdec_app.settings import MENU_DRAFTERS

    assert ("self-speculative (layer skip)", "layer_skip") in MENU_DRAFTERS
    final = outputs(send(client, "Count with me: one two three", drafter="layer_skip", max_new_tokens=24))
    spans = token_spans(final["chat"][1])
    expected = reference_reply(app_server, [{"role": "user", "content": "Count with me: one two three"}])
    assert "".join(text for _, text in spans) == expected.text
    assert "layer skip: early exit at 1/2 (1 of 2 layers): acceptance" in final["models"]


def test_retrieval_drafter_gives_the_engines_reply_and_shows_its_datastore(client, app_server):
    """The menu's "retrieval (the target's own replies)": the reply is the engine's, drafts come from
    the datastore or the conversation, and the models panel shows the datastore."""
    from specdec_app.settings import MENU_DRAFTERS

    assert ("retrieval (the target's own replies)", "retrieval") in MENU_DRAFTERS
    message = "Tell me about the sea"  # the tiny datastore holds the target's reply to it
    final = outputs(send(client, message, drafter="retrieval", max_new_tokens=24))
    spans = token_spans(final["chat"][1])
    expected = reference_reply(app_server, [{"role": "user", "content": message}])
    assert "".join(text for _, text in spans) == expected.text
    assert "draft" in {source for source, _ in spans}
    assert "retrieval datastore: ./retrieval" in final["models"]


def test_eagle_drafter_without_a_head_is_one_line(client):
    with pytest.raises(AppError, match="has no eagle: head source") as raised:
        send(client, "hi", preset="tiny-nodraft", drafter="eagle").result()
    assert "\n" not in str(raised.value)
    final = outputs(send(client, "hi", preset="tiny"))  # switch back
    assert token_spans(final["chat"][1])


def test_model_drafter_without_a_draft_model(client):
    with pytest.raises(AppError, match="has no draft model: choose the prompt lookup"):
        send(client, "hi", preset="tiny-nodraft", drafter="model").result()
    final = outputs(send(client, "hi", preset="tiny"))  # switch back
    assert token_spans(final["chat"][1])


# ---------------------------------------------------------------- command line and launch


def test_flags_and_auth_from_the_environment(monkeypatch):
    args = app.parse_args([])
    assert (args.preset, args.config, args.host, args.port, args.share, args.max_new_tokens) == (
        "auto", None, "127.0.0.1", 7860, False, 256)
    monkeypatch.setenv(app.AUTH_ENV, "ann:secret")
    assert app.parse_args([]).auth == "ann:secret"
    assert app.parse_args(["--auth", "bob:pw"]).auth == "bob:pw"
    with pytest.raises(SystemExit):
        app.parse_args(["--auth", "no-colon"])


def test_a_network_reachable_app_needs_a_login_or_the_risk_flag(capsys):
    for flags in (["--host", "0.0.0.0"], ["--host", "192.168.1.5"], ["--share"], ["--host", "myhost", "--share"]):
        with pytest.raises(SystemExit) as exited:
            app.parse_args(flags)
        error = capsys.readouterr().err
        assert exited.value.code == 2 and error.count("\n") == 1 and error.startswith("error: --"), flags
        assert "--auth USER:PASSWORD" in error and app.RISK_FLAG in error
    for auth in (":", "alice:", ":secret"):
        with pytest.raises(SystemExit) as exited:
            app.parse_args(["--auth", auth])
        assert exited.value.code == 2
        assert capsys.readouterr().err == "error: --auth takes USER:PASSWORD, both non-empty\n"
    for loopback in ("127.0.0.1", "localhost", "::1"):
        assert app.parse_args(["--host", loopback]).host == loopback
    logged_in = app.parse_args(["--host", "0.0.0.0", "--share", "--auth", "ann:pw"])
    assert "reachable from the network at 0.0.0.0:7860 and the public link https://x.gradio.live, behind the " \
           "--auth login" in app.exposure_line(logged_in, "https://x.gradio.live")
    risky = app.parse_args(["--host", "0.0.0.0", app.RISK_FLAG])
    assert app.exposure_line(risky, None) == (
        "Warning (--insecure-no-auth): anyone who reaches the network at 0.0.0.0:7860 can chat and generate "
        "through the app and Gradio's API (/gradio_api), no login.")
    assert app.exposure_line(app.parse_args([]), None) == ""


def test_unknown_preset_exits_2_with_the_list(tiny_app_config, capsys):
    assert app.main(["--preset", "nope", "--config", str(tiny_app_config)]) == 2
    assert "available: auto, tiny, tiny-nodraft, broken" in capsys.readouterr().err


def run_app(*flags: str, env: dict | None = None) -> tuple[subprocess.Popen, int]:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "app.py", "--port", str(port), *flags], cwd=REPO, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
    )
    return process, port


def wait_for_line(process: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        lines.append(line)
        if needle in line:
            return lines
    raise AssertionError(f"never printed {needle!r}; got:\n{''.join(lines)}")


def test_share_without_network_warns_and_keeps_serving(tiny_app_config):
    process, port = run_app("--share", app.RISK_FLAG, "--preset", "tiny", "--config", str(tiny_app_config))
    try:
        lines = wait_for_line(process, "Could not create a share link")
        text = "".join(lines)
        assert "Warning" not in text  # no link: nothing is reachable from elsewhere
        assert text.count("Could not create") == 1 and "Please check your internet" not in text
        assert f"127.0.0.1:{port}" in lines[-1]
        final = outputs(send(Client(f"http://127.0.0.1:{port}/", verbose=False), "hi"))
        assert token_spans(final["chat"][1])
    finally:
        process.terminate()
        process.wait(30)


def test_auth_from_the_environment_guards_the_app(tiny_app_config):
    process, port = run_app("--preset", "tiny", "--config", str(tiny_app_config),
                            env={app.AUTH_ENV: "ann:secret"})
    try:
        wait_for_line(process, "Running on local URL")
        url = f"http://127.0.0.1:{port}/"
        with pytest.raises(Exception):
            Client(url, verbose=False)
        final = outputs(send(Client(url, auth=("ann", "secret"), verbose=False), "hi"))
        assert token_spans(final["chat"][1])
    finally:
        process.terminate()
        process.wait(30)
