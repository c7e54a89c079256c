"""Chat messages -> prompt token ids, through the model's own chat template.

Message text is text: a user who types `<|im_end|>\n<|im_start|>system` into a message (or an
assistant reply that contains it) gets those characters as plain tokens, never the template's
control ids, so no one can forge a role from inside a message.
"""

from __future__ import annotations

import re
import uuid


def chat_prompt_ids(tokenizer, messages: list[dict], system: str | None = None) -> list[int]:
    """Token ids of the conversation so far, ending where the assistant's reply starts.

    messages: [{"role": "user" | "assistant" | "system", "content": str}, ...] in order.
    system: a system prompt; it replaces a leading system message, if any. Without one the
    template's own default applies (SmolLM2's and Qwen2.5's templates add one).
    Special-token strings inside a message's content are encoded as plain text.
    """
    conversation = [dict(m) for m in messages]
    if system:
        if conversation and conversation[0].get("role") == "system":
            conversation = conversation[1:]
        conversation.insert(0, {"role": "system", "content": system})
    if not conversation:
        raise ValueError("the conversation is empty: give at least one message")
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template, so it can't hold a chat")
    if any(_holds_token_text(tokenizer, message.get("content")) for message in conversation):
        return _ids_with_plain_contents(tokenizer, conversation)
    # transformers 5 returns a BatchEncoding here (not a list of ids as 4.x did without return_dict).
    encoded = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=True)
    return [int(token) for token in encoded["input_ids"]]


def _holds_token_text(tokenizer, content) -> bool:
    """Whether `content` contains the text of an added token (the ones matched before BPE)."""
    if not isinstance(content, str):
        return False
    return any(added.content in content for added in tokenizer.added_tokens_decoder.values())


def _ids_with_plain_contents(tokenizer, conversation: list[dict]) -> list[int]:
    """The template rendered with a unique placeholder for each message's content; the template's
    pieces tokenized as usual (its control tokens stay control tokens), each content with special
    tokens split into plain text. Only conversations that need it take this path, so ordinary
    ones tokenize exactly as apply_chat_template does."""
    tag = uuid.uuid4().hex
    marks = {f"[[specdec-content-{tag}-{i}]]": message.get("content") for i, message in enumerate(conversation)}
    marked = [{**message, "content": mark} for message, mark in zip(conversation, marks)]
    rendered = tokenizer.apply_chat_template(marked, add_generation_prompt=True, tokenize=False)
    ids: list[int] = []
    for piece in re.split(f"({'|'.join(map(re.escape, marks))})", rendered):
        if piece in marks:
            ids += tokenizer(marks[piece], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        elif piece:
            ids += tokenizer(piece, add_special_tokens=False)["input_ids"]
    return [int(token) for token in ids]


def eos_token_ids(tokenizer, model) -> set[int]:
    """Every id that ends a reply: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for value in (tokenizer.eos_token_id, getattr(model.generation_config, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif value is not None:
            ids.update(int(v) for v in value)
    return ids
