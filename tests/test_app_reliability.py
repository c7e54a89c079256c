"""The app keeps its reliability promises, driven through the real server with gradio_client:
a reply cut by the context limit says so, failures lose nothing, Stop works while loading, and
the message box keeps what was not sent."""

from __future__ import annotations

import pytest
from gradio_client import Client

from specdec_core.chat import chat_prompt_ids
from tests.test_app import outputs, send, text_of, token_spans


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
