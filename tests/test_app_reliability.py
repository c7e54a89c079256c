"""The app keeps its reliability promises, driven through the real server with gradio_client:
a reply cut by the context limit says so, failures lose nothing, Stop works while loading, and
the message box keeps what was not sent."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

from specdec_app import history as H
from specdec_app import render as R
from specdec_core.chat import chat_prompt_ids
from tests.conftest import free_port
from tests.test_app import OUT, REPO, controls, outputs, send, text_of, token_spans


@pytest.fixture
def client(app_server):
    return Client(app_server.url, verbose=False)


def message_of_prompt_length(tokenizer, tokens: int) -> str:
    """A user message whose chat prompt is exactly `tokens` long."""
    for words in range(tokens, 0, -1):
        message = "word " * words
        if len(chat_prompt_ids(tokenizer, [{"role": "user", "content": message}])) == tokens:
            return message
    raise AssertionError(f"no message gives a {tokens}-token prompt")


def test_a_reply_cut_by_the_context_limit_ends_with_a_note(app_server, client):
    models = app_server.holder.get("tiny")
    limit = models.target.config.max_position_embeddings
    message = message_of_prompt_length(models.tokenizer, limit - 5)
    final = outputs(send(client, message, max_new_tokens=24))
    reply = final["chat"][-1]
    assert len(token_spans(reply)) <= 5
    assert f"stopped at the model's context limit ({limit} tokens)" in text_of(reply)
    assert "cut at the context limit" in final["stats"]
    normal = outputs(send(Client(app_server.url, verbose=False), "hi", max_new_tokens=4))
    assert "context limit" not in text_of(normal["chat"][-1])


# ---------------------------------------------------------------- failures lose nothing


def test_a_failed_retry_keeps_the_turn_and_its_reply_and_the_preset(app_server, client):
    outputs(send(client, "First message"))
    before = outputs(send(client, "Second message"))
    assert len(before["chat"]) == 4
    job = client.submit(*controls(preset="broken"), api_name="/retry")
    with pytest.raises(AppError, match=r"no model folder.*preset tiny is still loaded"):
        job.result()
    restored = dict(zip(OUT, job.outputs()[-1]))
    assert restored["chat"] == before["chat"]  # both turns, the retried reply included
    assert app_server.holder.models.preset.name == "tiny" and app_server.holder.models.target is not None
    after = outputs(send(client, "Third message"))
    assert len(after["chat"]) == 6 and after["chat"][:4] == before["chat"]


def test_a_failed_preset_load_keeps_the_previous_preset_loaded_and_selected(app_server, client):
    loaded = app_server.holder.get("tiny")
    job = client.submit("broken", api_name="/load_preset")
    with pytest.raises(AppError, match=r"no model folder.*preset tiny is still loaded"):
        job.result()
    models_text, name, *_ = job.outputs()[-1]
    assert name == "tiny" and "target: ./target" in models_text  # the menu is back on what is loaded
    assert app_server.holder.models.preset.name == "tiny" and app_server.holder.models.target is not None
    assert loaded.target is None  # the old copy was unloaded first, then loaded back
    assert token_spans(outputs(send(client, "still works"))["chat"][1])


# ---------------------------------------------------------------- Stop while the models load


@pytest.fixture
def slow_loading_server(tiny_app_config):
    """The app on a holder whose loads wait until the test lets them go on (a real load after it)."""
    import app
    from specdec_core.presets.loading import load_preset

    go_on = threading.Event()

    def held_load(*args, **kwargs):
        go_on.wait(60)
        return load_preset(*args, **kwargs)

    holder = app.ModelHolder(str(tiny_app_config), loader=held_load)
    demo = app.build_ui("tiny", str(tiny_app_config), max_new_tokens=8, holder=holder)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield SimpleNamespace(url=demo.local_url, holder=holder, go_on=go_on)
    go_on.set()
    demo.close()
    holder.release()


def test_stop_during_the_first_load_ends_the_wait_and_the_next_send_works(slow_loading_server):
    server = slow_loading_server
    client = Client(server.url, verbose=False)
    job = send(client, "Hello while loading", max_new_tokens=8)
    while not any("Loading models" in update[OUT.index("stats")] for update in job.outputs()):
        time.sleep(0.02)
    panel, box, chat, _ = client.predict(R.LOADING, "", api_name="/stop")
    # The load is still held back, so Stop returned without waiting for it.
    assert server.holder.loading == "tiny" and server.holder.models is None
    assert "keeps loading in the background" in panel
    assert box == "Hello while loading" and chat == []  # the unanswered message is back in the box
    while not job.done():
        time.sleep(0.02)
    server.go_on.set()
    final = outputs(send(client, "Hello again", max_new_tokens=8))
    assert [m["role"] for m in final["chat"]] == ["user", "assistant"] and token_spans(final["chat"][1])
    assert server.holder.models.preset.name == "tiny"


# ---------------------------------------------------------------- Stop never loses history


@pytest.fixture
def busy_device(app_server):
    """Holds the device (as an API request would) until `release` is set."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with app_server.holder.turns.turn():
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold)
    yield SimpleNamespace(start=lambda: (thread.start(), held.wait(30)), release=release)
    release.set()
    if thread.is_alive() or held.is_set():
        thread.join(30)


@pytest.mark.parametrize("button", ["send", "retry"])
@pytest.mark.parametrize("when", ["waiting for the device", "streaming"])
def test_stop_keeps_the_history(app_server, client, busy_device, button, when):
    """Send or Retry, stopped while the reply waits for the device or while it streams: the
    conversation keeps every earlier turn, a stopped Retry its turn (with the earlier reply if
    no token came yet), and a Send stopped before its first token puts its message back."""
    first = outputs(send(client, "Name a river.", max_new_tokens=8))["chat"]
    streaming = when == "streaming"
    target = app_server.holder.get("tiny").target
    forwards = []
    hook = target.register_forward_hook(lambda *_: forwards.append(1))
    if not streaming:
        busy_device.start()
    settings = controls(baseline=True, max_new_tokens=450 if streaming else 8)
    job = (client.submit("Go on and on", *settings, api_name="/send") if button == "send"
           else client.submit(*settings, api_name="/retry"))
    try:
        if streaming:
            while len(forwards) < 20:
                assert not job.done(), "the reply ended before it could be stopped"
                time.sleep(0.01)
        else:
            while not job.outputs():  # the reply shows its turn, then waits for the device
                time.sleep(0.02)
            time.sleep(0.3)
            assert forwards == []
        panel, box, chat, _ = client.predict("x · generating…", "", api_name="/stop")
    finally:
        hook.remove()
        busy_device.release.set()
    while not job.done():
        time.sleep(0.02)
    skipped = {"__type__": "update"}  # gr.skip(): Stop left that output as it was
    if not streaming:
        assert chat == first  # nothing new started: the chat is as it was before the press
        assert box == ("Go on and on" if button == "send" else skipped)
        assert ("back in the box" if button == "send" else "earlier reply is kept") in panel
    else:
        assert chat == box == skipped and panel == "x · stopped"
        chat = dict(zip(OUT, job.outputs()[-1]))["chat"]  # the stopped reply as last shown
        assert chat[:-2 if button == "send" else -1] == (first if button == "send" else first[:-1])
        assert token_spans(chat[-1]) and chat[-1] != first[-1]
    after = outputs(send(client, "And the next?", max_new_tokens=4))["chat"]
    assert after[:len(chat)] == chat and len(after) == len(chat) + 2


# ---------------------------------------------------------------- a bad GGUF file in a preset


@pytest.fixture
def server_with_a_bad_gguf(tiny_app_config, tmp_path):
    import app

    (tmp_path / "broken.gguf").write_bytes(b"")
    config = tmp_path / "models.yaml"
    config.write_text(f"auto_fallback: tiny\npresets:\n  tiny:\n    description: d\n"
                      f"    target: {tiny_app_config.parent / 'target'}\n    drafter: prompt_lookup\n    memory_gb: 0.1\n"
                      f"  bad-gguf:\n    description: d\n    target: ./broken.gguf\n    drafter: none\n    memory_gb: 0.1\n")
    holder = app.ModelHolder(str(config))
    demo = app.build_ui("tiny", str(config), max_new_tokens=8, holder=holder)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    yield SimpleNamespace(url=demo.local_url, gguf=tmp_path / "broken.gguf")
    demo.close()
    holder.release()


def test_a_bad_gguf_preset_says_which_file_without_a_wrong_hint(server_with_a_bad_gguf):
    client = Client(server_with_a_bad_gguf.url, verbose=False)
    outputs(send(client, "hello", max_new_tokens=4))
    for attempt in (lambda: client.predict("bad-gguf", api_name="/load_preset"),
                    lambda: send(client, "again", preset="bad-gguf", max_new_tokens=4).result()):
        with pytest.raises(AppError) as raised:
            attempt()
        message = str(raised.value)
        assert str(server_with_a_bad_gguf.gguf) in message and "not a GGUF model" in message
        assert "Change the setting" not in message and "preset tiny is still loaded" in message


# ---------------------------------------------------------------- the cache memory in the panel


def test_the_models_panel_shows_the_kv_cache_memory(client):
    final = outputs(send(client, "How much memory?", drafter="model", adaptive=False, max_new_tokens=8))
    line = next(line for line in final["models"].splitlines() if "KV caches" in line)
    assert "target" in line and "draft" in line and " MB" in line


# ---------------------------------------------------------------- the history CSV's folders


def test_a_sessions_history_folder_goes_when_its_session_ends_and_the_rest_at_exit(app_server):
    client = Client(app_server.url, verbose=False)
    outputs(send(client, "hi", max_new_tokens=4))  # the reply writes the session's history CSV
    session = app_server.demo.state_holder[client.session_hash]
    history = next(value for value in session.state_data.values() if isinstance(value, H.ReplyHistory))
    folder = Path(history.csv_file()).parent
    assert (folder / "reply-history.csv").is_file()
    app_server.demo.state_holder.delete_state(client.session_hash)  # what gradio does when the session ends
    assert not folder.exists()
    # A session that never ends cleanly (the server stopped): its folder goes with the process's.
    script = "from specdec_app import history as H; print(H.ReplyHistory().csv_file())"
    written = Path(subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                                  check=True).stdout.strip())
    assert written.name == "reply-history.csv" and not written.parent.exists()
    assert not written.parent.parent.exists()


def test_a_closed_reply_ends_its_stream_before_the_stop_waiter_is_told(monkeypatch):
    """Stop cancels the event, which closes the reply's generator: the engine's stream must be
    closed before the stop flag's waiter returns, or a late "generating" update could overwrite
    the panel's "stopped" (StopRequests.request)."""
    from types import SimpleNamespace

    from specdec_app import wiring
    from specdec_app.settings import CONTROLS

    order = []

    def chat(*args, **kwargs):
        try:
            while True:
                yield wiring.View(stats="generating")
        finally:
            order.append("stream closed")

    monkeypatch.setattr(wiring, "chat", chat)
    events = wiring.ChatEvents(SimpleNamespace(), holder=None, preset="tiny")
    ended = events.stops.end
    monkeypatch.setattr(events.stops, "end", lambda *a: order.append("stop waiter told") or ended(*a))
    values = ("tiny", "prompt_lookup", 0.0, 1.0, 0, 8, 4, True, False, False)
    assert len(values) == len(CONTROLS)
    reply = events.respond(SimpleNamespace(session_hash="s"), "hi", [], None, *values)
    next(reply)
    reply.close()
    assert order == ["stream closed", "stop waiter told"]
