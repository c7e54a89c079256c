"""One chat completion on the shared models: wait for the device, build the engine and the
prompt, then pull the engine's tokens through the device thread (the engine applies the stop strings).

Blocking code: the routes call it from worker threads. The completion holds its turn on the
device from `start` to `close`; a set `gone` (the client disconnected) ends it within a round.
It is counted in the server's metrics once, when its reply ends or, cut short, at `close`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from ..chat import chat_prompt_ids
from ..engine import SpeculativeEngine
from ..errors import LoadError, PromptTooLong
from ..events import LENGTH, STOP, Stats
from ..presets.holder import ModelHolder
from ..presets.loaded import LoadedModels
from ..sampling import SamplingParams
from .errors import ApiError, bad_field
from .metrics import ServerMetrics
from .request import ChatRequest

log = logging.getLogger("specdec.api")
# The sampling fields a model's generation_config may set defaults for, and their types there.
MODEL_SAMPLING_DEFAULTS = {"temperature": float, "top_p": float, "top_k": int}


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
                 gone: threading.Event, turn: contextlib.ExitStack, arrived: float,
                 metrics: ServerMetrics | None = None) -> None:
        self.request = request
        self.models = models
        # The request's sampling, what it left out taken from the model's generation_config.
        self.params = with_model_defaults(request.params, request.omitted_sampling, models.target)
        self.prompt_ids = prompt_ids
        self.drafter = drafter  # the drafter name that ran ("model", "prompt_lookup", "none", ...)
        self.finish_reason: str | None = None  # "stop" | "length" once the pieces are all out
        self.completion_tokens = 0
        # time.perf_counter() when the request arrived, and gave its first and its last token
        self.arrived = arrived
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self._holder = holder
        self._engine = engine
        self._gone = gone
        self._turn = turn
        self._metrics = metrics

    @classmethod
    def start(cls, holder: ModelHolder, request: ChatRequest, gone: threading.Event,
              metrics: ServerMetrics | None = None) -> Completion:
        """Wait for the device in arrival order, load the model if needed, build the engine and
        the prompt. Raises QueueFull, DeviceBusy, Cancelled (gone while waiting), LoadError,
        ApiError (a bad drafter for this preset, a prompt over the context)."""
        arrived = time.perf_counter()
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
        return cls(holder, request, models, engine, prompt_ids, drafter, gone, turn, arrived, metrics)

    @property
    def stats(self) -> Stats:
        return self._engine.stats

    def pieces(self) -> Iterator[Piece]:
        """The reply, one engine token at a time (the engine applies the stop strings: text may
        lag behind a possible one, and the reply ends before the first)."""
        stream = self._engine.stream(self.prompt_ids, self.params, self.request.speculative.tree_nodes)
        steps = self._holder.steps(stream)
        try:
            for event in steps:
                self.last_token_at = time.perf_counter()
                if self.first_token_at is None:
                    self.first_token_at = self.last_token_at
                self.completion_tokens += 1
                yield Piece(event.text, [event.token_id], [event.source])
                if self._gone.is_set():
                    break
        finally:
            steps.close()  # ends the engine's generation now (on the device thread)
        # OpenAI has two reasons: "length" covers the engine's "length (context)" too.
        self.finish_reason = STOP if self.stats.finish_reason == STOP else LENGTH
        # Counted before the reply's last chunk goes out, so a scrape after it sees this reply.
        self._record()

    def close(self) -> None:
        """Give the device to the next in line (a reply cut short is counted in the metrics here)."""
        try:
            self._record()
        finally:
            self._turn.close()

    def _record(self) -> None:
        """Count the reply in the server's metrics, once."""
        metrics, self._metrics = self._metrics, None
        if metrics is not None:
            metrics.record(self)


def with_model_defaults(params: SamplingParams, omitted: Collection[str], target: object) -> SamplingParams:
    """`params` with each sampling field the request left out set from the target's
    generation_config where that sets it, as vLLM's server does (it reads no `do_sample`
    either); fields it doesn't set keep the API's defaults."""
    config = getattr(target, "generation_config", None)
    for name in omitted:
        value = getattr(config, name, None)
        if name not in MODEL_SAMPLING_DEFAULTS or value is None:
            continue
        try:
            params = dataclasses.replace(params, **{name: MODEL_SAMPLING_DEFAULTS[name](value)})
        except (TypeError, ValueError) as error:  # e.g. top_p 0: the API's default stays
            log.warning("The model's generation_config %s=%r is not used: %s", name, value, error)
    return params


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
