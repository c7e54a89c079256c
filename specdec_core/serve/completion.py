"""One chat completion on the shared models: wait for the device, build the engine and the
prompt, then pull the engine's tokens through the device thread (the engine applies the stop strings).

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
from ..errors import LoadError, PromptTooLong
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
            prompt_ids = _prompt_ids(models, request.messages, engine)
        except BaseException:
            turn.close()
            raise
        return cls(holder, request, models, engine, prompt_ids, drafter, gone, turn)

    @property
    def stats(self) -> Stats:
        return self._engine.stats

    def pieces(self) -> Iterator[Piece]:
        """The reply, one engine token at a time (the engine applies the stop strings: text may
        lag behind a possible one, and the reply ends before the first)."""
        stream = self._engine.stream(self.prompt_ids, self.request.params, self.request.speculative.tree_nodes)
        steps = self._holder.steps(stream)
        try:
            for event in steps:
                self.completion_tokens += 1
                yield Piece(event.text, [event.token_id], [event.source])
                if self._gone.is_set():
                    break
        finally:
            steps.close()  # ends the engine's generation now (on the device thread)
        # OpenAI has two reasons: "length" covers the engine's "length (context)" too.
        self.finish_reason = STOP if self.stats.finish_reason == STOP else LENGTH

    def close(self) -> None:
        """Give the device to the next in line."""
        self._turn.close()


def _prompt_ids(models: LoadedModels, messages: list[dict], engine: SpeculativeEngine) -> list[int]:
    try:
        return engine.checked_prompt(chat_prompt_ids(models.tokenizer, messages))
    except PromptTooLong as error:
        raise ApiError(400, f"The messages are {error.tokens} tokens, more than the model's context of "
                            f"{error.limit}: send fewer or shorter messages.",
                       param="messages", code="context_length_exceeded") from None
    except ValueError as error:  # no chat template, or nothing to read
        raise bad_field("messages", f"{error}.") from None
    except TypeError as error:  # text the tokenizer can't take (request.py refuses what it knows of)
        raise bad_field("messages", f"The tokenizer can't read these messages ({error}): send plain text.") from None
