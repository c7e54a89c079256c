"""Chat messages -> prompt token ids, through the model's own chat template."""

from __future__ import annotations


def chat_prompt_ids(tokenizer, messages: list[dict], system: str | None = None) -> list[int]:
    """Token ids of the conversation so far, ending where the assistant's reply starts.

    messages: [{"role": "user" | "assistant" | "system", "content": str}, ...] in order.
    system: a system prompt; it replaces a leading system message, if any. Without one the
    template's own default applies (SmolLM2's and Qwen2.5's templates add one).
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
    # transformers 5 returns a BatchEncoding here (not a list of ids as 4.x did without return_dict).
    encoded = tokenizer.apply_chat_template(conversation, add_generation_prompt=True, return_dict=True)
    return [int(token) for token in encoded["input_ids"]]
