"""One reply: load the preset if needed, read the prompt, stream the reply (or the baseline,
then the speculative reply, in side by side) into views, and measure it. The event handlers
(wiring.py) run these; nothing here knows the layout beyond the View's names."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import gradio as gr
import torch

from specdec_core import SamplingParams
from specdec_core.chat import chat_prompt_ids
from specdec_core.errors import DeviceBusy, LoadError, PromptTooLong
from specdec_core.events import LENGTH_CONTEXT
from specdec_core.presets.holder import Cancelled, ModelHolder
from specdec_core.presets.loaded import LoadedModels

from . import history as H
from . import render as R
from . import speedup as S
from .settings import Meter, Settings, View

log = logging.getLogger("specdec.app")

UPDATE_INTERVAL_S = 0.05  # stream at most ~20 updates a second so the browser keeps up
# The plots (race chart, acceptance by position) and the speedup figure redraw at most twice a
# second: each redraw costs the browser tens of ms of CPU, taken from the engine on a small
# machine; the reply's text and the stats stream at up to 20 updates a second.
PLOT_INTERVAL_S = 0.5
CALIBRATION_PROMPT = "Count from one to thirty, in words."
CALIBRATION_TOKENS = 24  # a short plain reply at load: a measured rate before any baseline is run

OOM_HELP = ("Out of memory: lower 'max new tokens', press Clear to shorten the conversation, "
            "or pick a smaller preset (or one with a 4-bit draft).")


class UserError(Exception):
    """A failure the user can fix; the message says how (shown as gr.Error)."""


def describe(models: LoadedModels) -> str:
    """The models panel: what the loaded models are, their notes, their kept caches."""
    return R.models_markdown(models.describe(), models.notes, models.cache_line())


def stream_reply(engine, prompt_ids: list[int], params: SamplingParams,
                 stop: threading.Event) -> Iterator[tuple[str, str, dict, list[int], list[str]]]:
    """Run one reply; yield (text, html, stats, token_ids, sources) every UPDATE_INTERVAL_S and at
    the end.

    A set `stop` ends it after the current token, with no final update. Ending or closing this
    generator (Stop, a dropped connection) closes the engine's stream, which stops the
    computation and frees its caches at once instead of at garbage collection.
    """
    stream = engine.stream(prompt_ids, params)
    text, spans, token_ids, sources = [], [], [], []
    last_update = 0.0
    try:
        for event in stream:
            token_ids.append(event.token_id)
            sources.append(event.source)
            if event.text:
                text.append(event.text)
                spans.append(R.token_span(event.text, event.source))
            if stop.is_set():
                return
            if time.monotonic() - last_update >= UPDATE_INTERVAL_S:
                last_update = time.monotonic()
                yield "".join(text), "".join(spans), engine.stats.as_dict(), token_ids, sources
        yield "".join(text), "".join(spans), engine.stats.as_dict(), token_ids, sources
    finally:
        stream.close()


def engine_for(models: LoadedModels, settings: Settings, baseline: bool):
    """The loaded preset's engine for these settings (kept across replies: its policy learns)."""
    if baseline:
        return models.engine(drafter="none")
    if settings.drafter == "model" and models.draft is None:
        raise UserError(f"Preset '{models.preset.name}' has no draft model: choose the prompt lookup drafter.")
    return models.engine(drafter=settings.drafter, draft_length=int(settings.draft_length),
                         adaptive=bool(settings.adaptive))


def checked_prompt(engine, turns: list[dict]) -> list[int]:
    """The chat-template prompt, refused with advice when it no longer fits the context."""
    try:
        return engine.checked_prompt(chat_prompt_ids(engine.tokenizer, R.prompt_messages(turns)))
    except PromptTooLong as error:
        raise UserError(f"The conversation is {error.tokens} tokens, more than the model's context of "
                        f"{error.limit}: press Clear to start a new one, or send a shorter message.") from None


def user_message(error: BaseException) -> str:
    """One line for the UI saying what went wrong and what to do; never a traceback."""
    if isinstance(error, (UserError, LoadError, DeviceBusy)):
        return str(error)
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)) or "out of memory" in str(error).lower():
        return OOM_HELP
    if isinstance(error, ValueError):  # bad settings or an unusable prompt, from the engine
        return f"{error}. Change the setting and send again."
    return f"Generation failed ({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). " \
           "Try again; the console has the details."


class Failed(NamedTuple):
    """What a failed reply puts back: the message box (None: leave it as it is) and the history."""

    box: str | None
    history: list


def guarded(failed: Failed, run: Callable[[], Iterator[View]]) -> Iterator[View]:
    """Run a chat generator; on failure put the box and the history back as they were, then
    show one line."""
    try:
        yield from run()
    except Exception as error:  # noqa: BLE001 - every failure becomes a message, never a traceback
        if not isinstance(error, (UserError, LoadError, DeviceBusy, ValueError)):
            log.exception("generation failed")
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # after an OOM, give the freed caches back before the next try
        history = failed.history
        box = gr.skip() if failed.box is None else failed.box
        yield View(msg=box, chat=R.chat_view(history), chat_baseline=R.chat_view(history, "baseline"),
                   turns=history)
        raise gr.Error(user_message(error)) from None


def chat(holder: ModelHolder, message: str, history: list, settings: Settings,
         stop: threading.Event, meter: Meter, box: object = "", retried: dict | None = None) -> Iterator[View]:
    """One user message: load if needed, then stream the reply (or baseline then speculative).
    `box`: what the message box shows meanwhile ("" when this consumed it; gr.skip(): leave it);
    `retried`: the turn a Retry replaces (Stop before the first token puts it back)."""
    turns = [*history, R.new_turn(message, baseline_pending=settings.compare, retried=retried)]
    waiting = R.LOADING if holder.models is None else "Reading the prompt…"
    yield View(msg=box, chat=R.chat_view(turns), chat_baseline=R.chat_view(turns, "baseline"), turns=turns,
               stats=waiting, tree=R.tree_html(None))  # the last reply's tree goes: this one may verify none
    try:
        with holder.using(settings.preset, cancelled=stop) as models:
            if stop.is_set():
                return
            holder.on_device(calibrate, models, meter.book)
            yield from holder.steps(reply(models, turns, settings, stop, meter))  # each step on the device thread
    except Cancelled:  # Stop while waiting for the device or the models: a load goes on by itself
        return


def reply(models: LoadedModels, turns: list[dict], settings: Settings, stop: threading.Event,
          meter: Meter) -> Iterator[View]:
    """Stream the reply to the last turn (or the baseline, then the speculative reply)."""
    turn = turns[-1]
    params = settings.sampling()
    prompt_ids = checked_prompt(engine_for(models, settings, baseline=True), turns)
    models_text = describe(models)
    preset, context = models.preset.name, len(prompt_ids)

    def view(stats_text, plot, speedup_text, live=gr.skip(), race=gr.skip(), **final) -> View:
        # The box: Send cleared it at the start; Retry leaves it alone.
        return View(chat=R.chat_view(turns), chat_baseline=R.chat_view(turns, "baseline"), turns=turns,
                    stats=stats_text, plot=plot, speedup=speedup_text, models=models_text, live=live, race=race,
                    **final)

    base_stats = base_ids = None
    base_points: list[tuple[float, int]] = []
    if settings.compare:  # baseline first, then speculative: each has the device to itself
        # Both halves read the same prompt tokens from the same cache state: the kept cache is
        # cropped to where the speculative engine would start, and back there after the baseline.
        start = engine_for(models, settings, baseline=False).share_reading(prompt_ids)
        engine = engine_for(models, settings, baseline=True)
        chart = S.Throttle(PLOT_INTERVAL_S, time.monotonic)
        for text, markup, stats, token_ids, _ in stream_reply(engine, prompt_ids, params, stop):
            turn.update(reply=text, baseline_html=markup)  # the history keeps a reply if stopped here
            base_points.append(S.race_point(stats))
            due = chart.due()
            yield view(R.stats_markdown(stats, "baseline"), R.acceptance_frame(None) if due else gr.skip(),
                       gr.skip(), S.live_markdown(stats, None, None, 0.0, baseline_reply=True),
                       S.race_frame([], base_points) if due else gr.skip())
        if stop.is_set():
            return
        base_stats, base_ids = stats, list(token_ids)
        meter.book.record(preset, S.BaselineRate.of_reply(stats, S.SIDE_BY_SIDE, context, time.time()))
        engine_for(models, settings, baseline=False).share_reading(prompt_ids, at_most=start)

    baseline_reply = settings.baseline and not settings.compare
    mode = settings.mode()
    engine = engine_for(models, settings, baseline=baseline_reply)
    live = LiveSpeedup(meter.book, preset, context, engine, baseline_reply,
                       plain=engine_for(models, settings, baseline=True))
    spec_points: list[tuple[float, int]] = []
    chart = S.Throttle(PLOT_INTERVAL_S, time.monotonic)

    def race():
        if baseline_reply:
            return S.race_frame(spec_points, spec_run=S.BASELINE_RUN)
        return S.race_frame(spec_points, base_points, live.rate)

    tree = TreeView(engine)
    for text, markup, stats, token_ids, sources in stream_reply(engine, prompt_ids, params, stop):
        turn.update(reply=text, reply_html=markup)
        spec_points.append(S.race_point(stats))
        live_text = live.update(stats, sources)
        so_far = S.side_by_side_so_far(stats, base_stats) if base_stats else gr.skip()
        panel = R.stats_markdown(stats, mode, last_tree_nodes=tree.nodes())
        if chart.due():  # the plots, the tree and the speedup figure: twice a second is live enough
            yield view(panel, R.acceptance_frame(stats), so_far, live_text, race(), tree=tree.html())
        else:
            yield view(panel, gr.skip(), so_far, gr.skip(), gr.skip())
    if stop.is_set():
        return
    if stats.get("finish_reason") == LENGTH_CONTEXT:  # say why the reply ends short
        turn.update(reply_html=markup + R.context_limit_note(engine.context_limit))

    live_text = live.finish(stats, sources)
    models_text = describe(models)  # the kept caches' memory, after this reply
    identical = (base_ids == token_ids) if params.greedy else None
    speedup_text = (R.speedup_markdown(stats, base_stats, identical, models.low_precision())
                    if settings.compare else gr.skip())
    drafter = "none" if baseline_reply else settings.drafter_label
    kind = "side by side" if settings.compare else ("baseline" if baseline_reply else "speculative")
    meter.log.add(H.history_row(len(meter.log.rows) + 1, turn["user"], kind, drafter, stats, live.rate, base_stats))
    yield view(R.stats_markdown(stats, mode, done=True, last_tree_nodes=tree.nodes()), R.acceptance_frame(stats),
               speedup_text, live_text, race(), history=H.history_frame(meter.log.rows),
               history_csv=meter.log.csv_file(), history_log=meter.log, tree=tree.html(final=True))


class TreeView:
    """#tree for one reply: the engine's last verified tree round (Stats.last_tree), its tokens
    decoded, drawn again only when a newer round replaced it."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self._drawn = None  # the TreeRound last drawn

    def nodes(self) -> int | None:
        """Nodes of the last tree round (None before one)."""
        tree = self.engine.stats.last_tree
        return len(tree.tokens) if tree is not None else None

    def html(self, final: bool = False):
        """The view's HTML, or gr.skip() when the round drawn last is still the latest (and at the
        end, the HTML anyway: a throttled update may have missed the last round)."""
        tree = self.engine.stats.last_tree
        if tree is None or (tree is self._drawn and not final):
            return gr.skip()
        self._drawn = tree
        piece = self.engine.tokenizer.decode
        return R.tree_html([piece([token]) for token in tree.tokens], tree.parents, tree.path,
                           (piece([tree.token]), tree.source))


class LiveSpeedup:
    """The #speedup-live figure of one reply: the plain rate it is compared with (chosen afresh
    at each update, as the engine's plain steps are measured) and Leviathan's prediction."""

    def __init__(self, book: S.BaselineBook, preset: str, context: int, engine, baseline_reply: bool,
                 plain=None) -> None:
        """plain: the engine that decodes the same target plainly (the calibration's, side by
        side's baseline half's), whose measured plain step prices the prediction when this
        engine never took one (every round drafted)."""
        self.book, self.preset, self.context, self.engine = book, preset, context, engine
        self.baseline_reply, self.plain = baseline_reply, plain
        self.step_before = engine.measured_plain_step_s()  # a plain step measured before this reply
        self.rate: S.BaselineRate | None = None

    def _plain_step(self, now: float) -> S.BaselineRate | None:
        """This reply's own plain steps, if it took any (the policy's running average moved)."""
        step = self.engine.measured_plain_step_s()
        return S.BaselineRate.of_plain_step(step, self.context, now) if step != self.step_before else None

    def update(self, stats: dict, sources: list[str]) -> str:
        now = time.time()
        if self.baseline_reply:
            return S.live_markdown(stats, None, None, now, baseline_reply=True)
        self.rate = self.book.choose(self.preset, self.context, self._plain_step(now))
        counts = self.engine.stats.tally()  # the engine's own record of this reply's rounds
        prediction = S.predict(counts, stats, self._step_s, self.engine.stats.node_acceptance)
        return S.live_markdown(stats, self.rate, prediction, now, counts=counts, step_s=self._step_s(1))

    def _step_s(self, tokens: int) -> float | None:
        """A target forward over `tokens` tokens as this engine measured it; a plain step it
        never took from the plain engine of the same target (one target, one machine)."""
        step = self.engine.step_s(tokens)
        if step is None and tokens == 1 and self.plain is not None:
            step = self.plain.measured_plain_step_s()
        return step

    def finish(self, stats: dict, sources: list[str]) -> str:
        """The final figure; then what this reply measured goes into the book for later ones."""
        text = self.update(stats, sources)
        now = time.time()
        self.book.record(self.preset, self._plain_step(now))
        if self.baseline_reply:
            self.book.record(self.preset, S.BaselineRate.of_reply(stats, S.BASELINE_REPLY, self.context, now))
        return text


def calibrate(models: LoadedModels, book: S.BaselineBook) -> None:
    """A short plain reply when a preset first loads, timed: the rate speculative replies compare
    with until a baseline is run. A failure only leaves the rate unmeasured (logged)."""
    preset = models.preset.name
    if book.has(preset, S.CALIBRATION):
        return
    engine = models.engine(drafter="none")
    try:
        prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": CALIBRATION_PROMPT}])
        stats = engine.generate(prompt, SamplingParams(max_new_tokens=CALIBRATION_TOKENS)).stats.as_dict()
    except Exception:  # noqa: BLE001 - the chat must work without a calibration
        log.exception("plain-decoding calibration of %s failed", preset)
        return
    finally:
        # A measurement must not change what follows: had the first reply reused the
        # calibration's cached system prompt, it would read its prompt in other calls than a
        # fresh process (the CLI, the API's first request) and could part from it at a tie.
        engine.forget()
    rate = S.BaselineRate.of_reply(stats, S.CALIBRATION, len(prompt), time.time())
    book.record(preset, rate)
    if rate is not None:
        log.info("calibration of %s: plain decoding %.1f tok/s (%s)", preset, rate.tokens_per_second, rate.detail)
