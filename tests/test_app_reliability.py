"""The app keeps its reliability promises, driven through the real server with gradio_client:
a reply cut by the context limit says so, failures lose nothing, Stop works while loading, and
the message box keeps what was not sent."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest
from gradio_client import Client
from gradio_client.exceptions import AppError

import app_render as R
from specdec_core.chat import chat_prompt_ids
from tests.conftest import free_port
from tests.test_app import OUT, controls, outputs, send, text_of, token_spans


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
