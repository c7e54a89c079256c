"""A chat completion request, checked: OpenAI's fields plus our extensions (`top_k`,
`speculative`, `return_sources`). Unknown fields are ignored, as OpenAI's SDK expects; a bad
value is a 400 naming the field and the range it takes."""

from __future__ import annotations

import json
import math
from collections.abc import Collection
from dataclasses import dataclass

from ..policy import DRAFT_LENGTH_BOUNDS
from ..policy.bounds import TREE_NODES_BOUNDS
from ..presets.config import AUTO, DRAFTERS
from ..sampling import MAX_SEED, MIN_TEMPERATURE, SamplingParams
from .errors import ApiError, bad_field

ROLES = ("system", "user", "assistant")
MAX_STOP_STRINGS = 4  # as OpenAI's API
SAMPLING_FIELDS = ("temperature", "top_p", "top_k")  # a model's generation_config may default them
MAX_DRAFT_LENGTH = DRAFT_LENGTH_BOUNDS[1]  # the engine's bound, as the app's slider
# A chat request is 4 levels deep (body, messages, message, content parts); tools' JSON schemas
# add some. Far deeper bodies only serve to exhaust the parser's recursion.
MAX_JSON_DEPTH = 64


@dataclass(frozen=True)
class Speculative:
    """The `speculative` extension; None fields take the preset's defaults."""

    drafter: str | None = None
    draft_length: int | None = None
    adaptive: bool | None = None
    tree_nodes: int | None = None  # the most draft tokens a round may verify as a tree (0: chains only)


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict]  # [{"role", "content": str}], roles in ROLES
    params: SamplingParams  # the stop strings too (params.stop)
    # Sampling fields the request left out: the model's generation_config may set them
    # (serve.completion.with_model_defaults); params holds the API's defaults for them.
    omitted_sampling: frozenset[str]
    stream: bool
    include_usage: bool  # stream_options.include_usage: a last chunk with `usage`
    speculative: Speculative
    return_sources: bool


def parse_json(raw: bytes) -> object:
    """The body as JSON, nested at most MAX_JSON_DEPTH deep. ApiError 400 otherwise."""
    try:
        body = json.loads(raw)
    except RecursionError:  # nested far deeper than the limit: the parser gave up
        body = None
        depth = math.inf
    except (ValueError, UnicodeDecodeError):
        raise ApiError(400, "The request body is not valid JSON.") from None
    else:
        depth = _depth(body)
    if depth > MAX_JSON_DEPTH:
        raise ApiError(400, f"The request body is nested more than {MAX_JSON_DEPTH} levels deep; a chat "
                            "completion request needs a handful.")
    return body


def _depth(value: object) -> int:
    """How deep lists and objects nest in a parsed JSON value (iteratively: no recursion limit)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is not None:
            deepest = max(deepest, depth)
            if depth <= MAX_JSON_DEPTH:  # one level past the limit is enough to refuse
                stack.extend((child, depth + 1) for child in children)
    return deepest


def parse_chat_request(body: object, presets: Collection[str], default_max_tokens: int) -> ChatRequest:
    """The checked request. ApiError: 400 for a bad field, 404 for a model that is not a preset."""
    if not isinstance(body, dict):
        raise ApiError(400, "The request body must be a JSON object (OpenAI's chat completion request).")
    model = _string(body, "model", AUTO)
    if model != AUTO and model not in presets:
        raise ApiError(404, f"The model '{model}' does not exist: use one of {', '.join([AUTO, *presets])} "
                            "(GET /v1/models lists them).", param="model", code="model_not_found")
    if _integer(body, "n", 1, low=1) != 1:
        raise bad_field("n", "n must be 1: one choice per request.")
    # max_completion_tokens is OpenAI's newer name for max_tokens; it wins when both are given.
    max_tokens = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    params = SamplingParams(
        temperature=_temperature(body),
        top_p=_number(body, "top_p", 1.0, low=0.0, high=1.0, low_open=True),
        top_k=_integer(body, "top_k", 0, low=0),
        max_new_tokens=_integer(body, max_tokens, default_max_tokens, low=1),
        seed=_integer(body, "seed", None, low=0, high=MAX_SEED),
        stop=_stop(body.get("stop")),
    )
    stream_options = body.get("stream_options") or {}
    if not isinstance(stream_options, dict):
        raise bad_field("stream_options", "stream_options must be an object, e.g. {\"include_usage\": true}.")
    return ChatRequest(
        model=model,
        messages=_messages(body.get("messages")),
        params=params,
        omitted_sampling=frozenset(name for name in SAMPLING_FIELDS if body.get(name) is None),
        stream=_boolean(body, "stream", False),
        include_usage=_boolean(stream_options, "include_usage", False, "stream_options."),
        speculative=_speculative(body.get("speculative")),
        return_sources=_boolean(body, "return_sources", False),
    )


def _messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise bad_field("messages", "messages must be a non-empty list of {\"role\", \"content\"} objects.")
    checked = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise bad_field(where, f"{where} must be an object with \"role\" and \"content\".")
        role = "system" if message.get("role") == "developer" else message.get("role")
        if role not in ROLES:
            raise bad_field(f"{where}.role", f"{where}.role must be one of {', '.join(ROLES)}, "
                                             f"got {message.get('role')!r}.")
        checked.append({"role": role, "content": _content(message.get("content"), f"{where}.content")})
    return checked


def _content(content: object, where: str) -> str:
    """A message's text: a string, or a list of {"type": "text", "text"} parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return _text(content, where)
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text"
                                         and isinstance(p.get("text"), str) for p in content):
        return _text("".join(part["text"] for part in content), where)
    raise bad_field(where, f"{where} must be a string or a list of text parts "
                           "({\"type\": \"text\", \"text\": ...}); this server reads text only.")


def _text(text: str, where: str) -> str:
    """Text the tokenizer can take: JSON's \\uD800-style escapes can make a lone surrogate,
    which is no character at all (the tokenizer fails on it with a TypeError)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise bad_field(where, f"{where} holds {text[error.start]!r} at index {error.start}, half of a UTF-16 "
                               "surrogate pair, which is not text: send valid Unicode.") from None
    return text


def _stop(stop: object) -> tuple[str, ...]:
    stops = [stop] if isinstance(stop, str) else stop
    if stops is None:
        return ()
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP_STRINGS
            and all(isinstance(s, str) and s for s in stops)):
        raise bad_field("stop", f"stop must be a non-empty string or a list of at most {MAX_STOP_STRINGS} "
                                "non-empty strings.")
    return tuple(stops)


def _speculative(value: object) -> Speculative:
    if value is None:
        return Speculative()
    if not isinstance(value, dict):
        raise bad_field("speculative", "speculative must be an object: {\"drafter\", \"draft_length\", \"adaptive\", "
                                       "\"tree_nodes\"}.")
    drafter = value.get("drafter")
    if drafter is not None and drafter not in DRAFTERS:
        raise bad_field("speculative.drafter", f"speculative.drafter must be one of {', '.join(DRAFTERS)}, "
                                               f"got {drafter!r}.")
    return Speculative(
        drafter=drafter,
        draft_length=_integer(value, "draft_length", None, low=DRAFT_LENGTH_BOUNDS[0], high=MAX_DRAFT_LENGTH, prefix="speculative."),
        adaptive=_boolean(value, "adaptive", None, "speculative."),
        tree_nodes=_integer(value, "tree_nodes", None, low=TREE_NODES_BOUNDS[0], high=TREE_NODES_BOUNDS[1],
                            prefix="speculative."),
    )


# ---------------------------------------------------------------- typed fields


def _string(body: dict, name: str, default: str) -> str:
    value = body.get(name, default)
    if not isinstance(value, str):
        raise bad_field(name, f"{name} must be a string, got {value!r}.")
    return _text(value, name)


def _boolean(body: dict, name: str, default: bool | None, prefix: str = "") -> bool | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_field(prefix + name, f"{prefix}{name} must be true or false, got {value!r}.")
    return value


def _integer(body: dict, name: str, default: int | None, low: int | None = None, high: int | None = None,
             prefix: str = "") -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    ok = isinstance(value, int) and not isinstance(value, bool)
    if not ok or (low is not None and value < low) or (high is not None and value > high):
        raise bad_field(prefix + name, f"{prefix}{name} must be an integer{_range(low, high)}, got {value!r}.")
    return value


def _temperature(body: dict) -> float:
    """0 (greedy) or [MIN_TEMPERATURE, 2]: below the minimum, logits divided by the temperature
    overflow float32 (see sampling.MIN_TEMPERATURE)."""
    temperature = _number(body, "temperature", 1.0, low=0.0, high=2.0)
    if 0 < temperature < MIN_TEMPERATURE:
        raise bad_field("temperature", f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, 2], got "
                                       f"{temperature!r}: below {MIN_TEMPERATURE:g} sampling is greedy in all "
                                       "but name, so send 0.")
    return temperature


def _number(body: dict, name: str, default: float, low: float, high: float, low_open: bool = False) -> float:
    value = body.get(name)
    if value is None:
        return default
    # NaN compares false with everything, so it would pass the range checks below.
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value > high or value < low or (low_open and value == low):
        interval = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise bad_field(name, f"{name} must be a number in {interval}, got {value!r}.")
    return float(value)


def _range(low: int | None, high: int | None) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    return f" >= {low}" if low is not None else ""
