"""One chat completion on the shared models: wait for the device, build the engine and the
prompt, then pull the engine's tokens through the device thread, applying OpenAI's stop rule.

Blocking code: the routes call it from worker threads. The completion holds its turn on the
device from `start` to `close`; a set `gone` (the client disconnected) ends it within a round.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from ..chat import chat_prompt_ids
from ..engine import SpeculativeEngine
from ..errors import LoadError
from ..events import LENGTH, STOP, Stats
from ..presets.holder import ModelHolder
from ..presets.loaded import LoadedModels
from .errors import ApiError, bad_field
from .request import ChatRequest


@dataclass(frozen=True)
class Piece:
    """What one step adds to the reply: text (stop-checked) and the tokens it came from."""

    text: str
    token_ids: list[int]
    sources: list[str]


class StopText:
    """The reply's text under OpenAI's stop rule: it ends before the first stop string.

    While streaming, the tail that could still be the start of a stop string is held back
    until the next tokens show it is not; what `push` returns is final.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = stops
        self._text = ""
        self._sent = 0  # text before this index has been handed out
        self.hit = False

    def push(self, piece: str) -> str:
        """Add a piece of the reply; return the text that is now certain to be part of it."""
        self._text += piece
        found = [i for i in (self._text.find(s, self._sent) for s in self._stops) if i >= 0]
        if found:
            self.hit = True
            return self._release(min(found))
        return self._release(len(self._text) - self._held_back())

    def flush(self) -> str:
        """The reply is over without a stop string: the held-back tail is text after all."""
        return "" if self.hit else self._release(len(self._text))

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of a stop string."""
        tail = self._text[self._sent:]
        return max((n for s in self._stops for n in range(min(len(s) - 1, len(tail)), 0, -1)
                    if s.startswith(tail[-n:])), default=0)

    def _release(self, end: int) -> str:
        released, self._sent = self._text[self._sent:end], end
        return released


class Completion:
    """One request's generation, holding the device (use `start`; always `close`)."""

    def __init__(self, holder: ModelHolder, request: ChatRequest, models: LoadedModels,
                 engine: SpeculativeEngine, prompt_ids: list[int], drafter: str,
                 gone: threading.Event, turn: contextlib.ExitStack) -> None:
        self.request = request
        self.models = models
        self.prompt_ids = prompt_ids
        self.drafter = drafter  # the drafter name that ran ("model", "prompt_lookup", "none", ...)
        self.finish_reason: str | None = None  # "stop" | "length" once the pieces are all out
        self.completion_tokens = 0
        self._holder = holder
        self._engine = engine
        self._gone = gone
        self._turn = turn

    @classmethod
    def start(cls, holder: ModelHolder, request: ChatRequest, gone: threading.Event) -> Completion:
        """Wait for the device in arrival order, load the model if needed, build the engine and
        the prompt. Raises QueueFull, DeviceBusy, Cancelled (gone while waiting), LoadError,
        ApiError (a bad drafter for this preset, a prompt over the context)."""
        turn = contextlib.ExitStack()
        try:
            models = turn.enter_context(holder.using(request.model, cancelled=gone))
            spec = request.speculative
            drafter = spec.drafter or models.preset.drafter
            try:
                engine = holder.on_device(models.engine, drafter, spec.draft_length, spec.adaptive)
            except LoadError as error:  # the preset lacks what this drafter needs (a draft model)
                raise bad_field("speculative.drafter", f"{error}.") from None
            prompt_ids = _prompt_ids(models, request.messages, engine.context_limit)
        except BaseException:
            turn.close()
            raise
        return cls(holder, request, models, engine, prompt_ids, drafter, gone, turn)

    @property
    def stats(self) -> Stats:
        return self._engine.stats

    def pieces(self) -> Iterator[Piece]:
        """The reply, one engine token at a time (text may lag behind a possible stop string)."""
        text = StopText(self.request.stop)
        steps = self._holder.steps(self._engine.stream(self.prompt_ids, self.request.params))
        try:
            for event in steps:
                self.completion_tokens += 1
                yield Piece(text.push(event.text), [event.token_id], [event.source])
                if text.hit or self._gone.is_set():
                    break
        finally:
            steps.close()  # ends the engine's generation now (on the device thread)
        tail = text.flush()
        if tail:
            yield Piece(tail, [], [])
        # OpenAI has two reasons: "length" covers the engine's "length (context)" too.
        self.finish_reason = STOP if text.hit or self.stats.finish_reason == STOP else LENGTH

    def close(self) -> None:
        """Give the device to the next in line."""
        self._turn.close()


def _prompt_ids(models: LoadedModels, messages: list[dict], context_limit: int) -> list[int]:
    try:
        prompt_ids = chat_prompt_ids(models.tokenizer, messages)
    except ValueError as error:  # no chat template, or nothing to read
        raise bad_field("messages", f"{error}.") from None
    except TypeError as error:  # text the tokenizer can't take (request.py refuses what it knows of)
        raise bad_field("messages", f"The tokenizer can't read these messages ({error}): send plain text.") from None
    if len(prompt_ids) >= context_limit:
        raise ApiError(400, f"The messages are {len(prompt_ids)} tokens, more than the model's context of "
                            f"{context_limit}: send fewer or shorter messages.",
                       param="messages", code="context_length_exceeded")
    return prompt_ids
