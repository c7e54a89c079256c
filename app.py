"""The speculative-decoding chat app: `python app.py [--preset NAME] [--share --auth USER:PASSWORD]`.

Wiring and launch only: the engine lives in specdec_core, the formatting in app_render.
`build_ui()` returns the Blocks without launching or loading anything, so tests can drive it;
models load on the first page view, the first message or a pick in the preset menu.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import NamedTuple, NoReturn

import gradio as gr
import torch

import app_render as R
import app_speedup as S
from specdec_core import SamplingParams
from specdec_core.chat import chat_prompt_ids
from specdec_core.presets.config import ConfigError, load_presets
from specdec_core.errors import DeviceBusy, LoadError
from specdec_core.events import LENGTH_CONTEXT
from specdec_core.kernels.int4_linear import Int4Linear
from specdec_core.policy import DRAFT_LENGTH_BOUNDS
from specdec_core.kernels.row_attention import uses_row_exact_attention
from specdec_core.presets.holder import Cancelled, ModelHolder
from specdec_core.presets.loaded import LoadedModels
from specdec_core.presets.loading import load_preset
from specdec_core.serve import API_KEY_ENV, ApiAccess, access_for, api_routes, is_loopback

log = logging.getLogger("specdec.app")

AUTH_ENV = "SPECDEC_AUTH"
RISK_FLAG = "--insecure-no-auth"  # serve a network-reachable app without a login, knowingly
DEVICE = "device"  # one concurrency group: loading and generating share the device
UPDATE_INTERVAL_S = 0.05  # stream at most ~20 updates a second so the browser keeps up
# The plots (race chart, acceptance by position) and the speedup figure redraw at most twice a
# second: each redraw costs the browser tens of ms of CPU, taken from the engine on a small
# machine; the reply's text and the stats stream at up to 20 updates a second.
PLOT_INTERVAL_S = 0.5
CALIBRATION_PROMPT = "Count from one to thirty, in words."
CALIBRATION_TOKENS = 24  # a short plain reply at load: a measured rate before any baseline is run
DRAFTERS = [("draft model", "model"), ("prompt lookup", "prompt_lookup"), ("EAGLE head", "eagle"), ("hybrid", "hybrid")]

OOM_HELP = ("Out of memory: lower 'max new tokens', press Clear to shorten the conversation, "
            "or pick a smaller preset (or one with a 4-bit draft).")


@dataclass
class _Run:
    """One running reply: the flag it checks, and the signal that it is over."""

    stop: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


class StopRequests:
    """Stop requests by browser session, shared by all sessions like the models.

    The Stop button sets its session's flag and the running reply checks it after every token,
    so the engine stops within the round it is in. (Cancelling the event alone waits until the
    current batch of streamed tokens, up to UPDATE_INTERVAL_S of work, is done.)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: dict[str, _Run] = {}

    def begin(self, session: str) -> _Run:
        """A reply starts; it checks `run.stop` and calls end(session, run) when it is over."""
        run = _Run()
        with self._lock:
            self._running[session] = run
        return run

    def end(self, session: str, run: _Run) -> None:
        with self._lock:
            if self._running.get(session) is run:
                del self._running[session]
        run.ended.set()

    def request(self, session: str, wait_s: float = 10.0) -> None:
        """Stop the session's running reply, and return once it has ended (within a round).

        Waiting matters: the panel is marked stopped only after the reply's last update, so a
        late "generating" update can't overwrite it, and gradio's cancel of the event is done
        before the user can send the next message.
        """
        with self._lock:
            run = self._running.get(session)
        if run is not None:
            run.stop.set()
            run.ended.wait(wait_s)


@dataclass(frozen=True)
class Settings:
    """The control values, in the order the controls are passed as event inputs."""

    preset: str
    drafter: str
    temperature: float
    top_p: float
    top_k: int
    max_new_tokens: int
    draft_length: int
    adaptive: bool
    baseline: bool
    compare: bool

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=float(self.temperature), top_k=int(self.top_k),
                              top_p=float(self.top_p), max_new_tokens=int(self.max_new_tokens))

    def mode(self) -> str:
        """The panel's name for the main pane's decoding."""
        if self.baseline and not self.compare:
            return "baseline"
        return f"speculative · {dict((v, k) for k, v in DRAFTERS).get(self.drafter, self.drafter)}"


class View(NamedTuple):
    """Everything a chat event updates, in the order of the event's outputs."""

    msg: str
    chat: list
    chat_baseline: list
    turns: list
    stats: str
    plot: object
    speedup: str
    models: str
    live: object = gr.skip()  # #speedup-live
    race: object = gr.skip()  # #race-chart
    history: object = gr.skip()  # #history (only at a reply's end)
    history_csv: object = gr.skip()  # its CSV download
    # The session's ReplyHistory, set when it wrote its CSV: gradio calls a State's delete
    # callback (which removes the CSV's folder) only for states an event has set.
    history_log: object = gr.skip()


@dataclass(frozen=True)
class Meter:
    """What a reply measures into: the server's plain rates and the session's history."""

    book: S.BaselineBook
    log: S.ReplyHistory


class UserError(Exception):
    """A failure the user can fix; the message says how (shown as gr.Error)."""


# ---------------------------------------------------------------- generation


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


def checked_prompt(models: LoadedModels, turns: list[dict]) -> list[int]:
    """The chat-template prompt, refused with advice when it no longer fits the context."""
    prompt_ids = chat_prompt_ids(models.tokenizer, R.prompt_messages(turns))
    limit = getattr(models.target.config.get_text_config(), "max_position_embeddings", None)
    if limit and len(prompt_ids) >= limit:
        raise UserError(f"The conversation is {len(prompt_ids)} tokens, more than the model's context of "
                        f"{limit}: press Clear to start a new one, or send a shorter message.")
    return prompt_ids


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


# ---------------------------------------------------------------- the UI


def build_ui(preset: str = "auto", config_path: str | None = None, max_new_tokens: int = 256,
             holder: ModelHolder | None = None) -> gr.Blocks:
    """The chat app as a gr.Blocks (queued, not launched). Loads no model."""
    presets = load_presets(config_path)  # ConfigError here: a bad models.yaml fails at start
    if preset != "auto" and preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; available: auto, {', '.join(presets)}")
    with gr.Blocks(title="Speculative decoding chat") as demo:
        ui = _layout(presets, preset, max_new_tokens)
        _wire(demo, ui, holder or ModelHolder(config_path), StopRequests(), preset)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


def _layout(presets: dict, preset: str, max_new_tokens: int) -> SimpleNamespace:
    """Place the components (inside a gr.Blocks); returns them by name."""
    start = presets.get(preset)
    # A session's history CSV folder goes when gradio drops the session's state (an hour after
    # its tab closed; see View.history_log); what is left at exit goes with the process's folder.
    ui = SimpleNamespace(turns=gr.State([]),
                         history_log=gr.State(S.ReplyHistory(), delete_callback=S.ReplyHistory.remove_files))
    gr.Markdown("# Speculative decoding chat\nEach reply token is coloured by where it came from.")
    gr.HTML(R.legend_html(), elem_id="legend", head=S.RACE_DASHED_CSS)
    with gr.Row():
        with gr.Column(scale=3):
            with gr.Row():
                with gr.Column(visible=False) as ui.baseline_pane:
                    ui.chat_baseline = gr.Chatbot(label="Baseline (plain decoding)", elem_id="chat-baseline",
                                                  render_markdown=False, height=460)
                ui.chat = gr.Chatbot(label="Chat", elem_id="chat", render_markdown=False, height=460)
            ui.speedup = gr.Markdown(R.speedup_markdown(None, None, None), elem_id="speedup", visible=False)
            ui.msg = gr.Textbox(label="Message", elem_id="msg", lines=2, placeholder="Ask something…")
            with gr.Row():
                ui.send = gr.Button("Send", elem_id="send", variant="primary")
                ui.stop = gr.Button("Stop", elem_id="stop", variant="stop")
                ui.retry = gr.Button("Retry", elem_id="retry")
                ui.clear = gr.Button("Clear", elem_id="clear")
            with gr.Row():
                ui.baseline = gr.Checkbox(False, label="Baseline (no speculation)", elem_id="baseline")
                ui.compare = gr.Checkbox(False, label="Side by side: baseline, then speculative",
                                         elem_id="compare")
        with gr.Column(scale=2, elem_id="stats"):
            ui.live = gr.Markdown(S.live_markdown(None, None, None, 0.0), elem_id="speedup-live")
            ui.race = gr.LinePlot(S.race_frame([]), x="seconds", y="tokens", color="run",
                                  color_map=S.RACE_COLOURS, title="Race: tokens against seconds, after the first token",
                                  x_title="seconds of engine time after the first token", y_title="tokens", height=220,
                                  elem_id="race-chart")
            ui.stats = gr.Markdown(R.stats_markdown(None, "speculative"), elem_id="stats-text")
            ui.plot = gr.BarPlot(R.acceptance_frame(None), x="position", y="acceptance", y_lim=[0, 1],
                                 title="Acceptance by draft position", x_title="draft position",
                                 y_title="accepted share", height=220, elem_id="acceptance-plot")
            ui.models = gr.Markdown(R.models_markdown(None), elem_id="models")
    with gr.Accordion("This session's replies", open=True):
        ui.history = gr.Dataframe(S.history_frame([]), elem_id="history", interactive=False, wrap=True)
        ui.history_csv = gr.DownloadButton("Download the history as CSV", elem_id="history-csv", size="sm")
    with gr.Accordion("Settings", open=True):
        with gr.Row():
            ui.preset = gr.Dropdown(_preset_choices(presets), value=preset, label="Preset", elem_id="preset")
            ui.drafter = gr.Dropdown(DRAFTERS, value=_menu_drafter(start.drafter if start else None),
                                     label="Drafter", elem_id="drafter",
                                     info="A 4-bit draft model saves memory, not time: on GPUs nf4 "
                                          "is slower per token than bf16.")
            ui.draft_length = gr.Slider(*DRAFT_LENGTH_BOUNDS, value=start.draft_length if start else 5, step=1,
                                        label="Draft length (start value when adaptive)", elem_id="draft-length")
            ui.adaptive = gr.Checkbox(start.adaptive if start else True, label="Adaptive draft length",
                                      elem_id="adaptive")
        with gr.Row():
            ui.temperature = gr.Slider(0, 2, value=0, step=0.05, label="Temperature (0 = greedy)",
                                       elem_id="temperature")
            ui.top_p = gr.Slider(0.05, 1, value=1, step=0.05, label="Top-p (1 = off)", elem_id="top-p")
            ui.top_k = gr.Slider(0, 200, value=0, step=1, label="Top-k (0 = off)", elem_id="top-k")
            ui.max_new_tokens = gr.Slider(1, max(4096, max_new_tokens), value=max_new_tokens, step=1,
                                          label="Max new tokens", elem_id="max-new-tokens")
    return ui


def _wire(demo: gr.Blocks, ui: SimpleNamespace, holder: ModelHolder, stops: StopRequests, preset: str) -> None:
    """Connect the events. Everything that uses the device shares one concurrency group."""
    controls = [getattr(ui, name) for name in Settings.__dataclass_fields__]  # Settings' order
    outputs = [ui.msg, ui.chat, ui.chat_baseline, ui.turns, ui.stats, ui.plot, ui.speedup, ui.models,
               ui.live, ui.race, ui.history, ui.history_csv, ui.history_log]
    book = S.BaselineBook()  # every session's measured plain rates: one machine, one set of models

    def reply(request: gr.Request, message: str, history: list, log: S.ReplyHistory, values: tuple,
              failed: Failed, retried: dict | None = None):
        """Answer `message` after `history`; on failure show `failed` (the box and chat as they were).
        `retried`: the turn a Retry replaces."""
        settings = Settings(*values)
        session = request.session_hash or ""
        run = stops.begin(session)
        try:
            meter = Meter(book, log)
            # The box is cleared only when this consumed it (Send); a failure puts it back.
            box = gr.skip() if failed.box is None else ""
            yield from _guarded(failed, lambda: _chat(holder, message, history, settings, run.stop, meter, box,
                                                      retried))
        finally:
            stops.end(session, run)

    def respond(request: gr.Request, message: str, history: list, log: S.ReplyHistory, *values):
        if not (message or "").strip():
            raise gr.Error("Empty message: type something in the box, then press Send.")
        # Send consumed the box: a failure puts the message back.
        yield from reply(request, message, history, log, values, Failed(message, history))

    def retry_last(request: gr.Request, history: list, log: S.ReplyHistory, *values):
        if not history:
            raise gr.Error("Nothing to retry yet: send a message first.")
        # Retry leaves the box alone, and a failure keeps the turn it retried, reply and all.
        yield from reply(request, history[-1]["user"], history[:-1], log, values, Failed(None, history), history[-1])

    def stop_reply(request: gr.Request, panel: str, message: str, history: list):
        """Stop the session's reply. A message that got no reply at all (stopped while the
        models loaded or the prompt was read) goes back to the box, unless something new is there;
        a Retry stopped then puts back the turn it was replacing, reply and all."""
        stops.request(request.session_hash or "")
        if history and not history[-1]["reply"] and history[-1].get(R.RETRIED):
            history = [*history[:-1], history[-1][R.RETRIED]]
            return (R.stopped_before_retry_markdown(holder.loading), gr.skip(), R.chat_view(history),
                    R.chat_view(history, "baseline"), history)
        if history and not history[-1]["reply"]:
            box = message if (message or "").strip() else history[-1]["user"]
            history = history[:-1]
            return (R.stopped_before_reply_markdown(holder.loading), box, R.chat_view(history),
                    R.chat_view(history, "baseline"), history)
        return R.stopped_markdown(panel), gr.skip(), gr.skip(), gr.skip(), gr.skip()

    def clear_all(request: gr.Request):
        stops.request(request.session_hash or "")  # a running reply must not refill the cleared chat
        return View("", [], [], [], R.stats_markdown(None, "speculative"), R.acceptance_frame(None),
                    R.speedup_markdown(None, None, None), _models_text(holder),
                    S.live_markdown(None, None, None, 0.0), S.race_frame([]))

    def change_preset(name: str, progress=gr.Progress(track_tqdm=True)):
        """Load the picked preset. If it fails, the menu and panel go back to what is loaded
        (the holder loads the previous preset back), then the error shows."""
        # track_tqdm: compiling the steps (minutes on a GPU) shows its bar, shape by shape, with
        # tqdm's estimate of the time left
        progress(0, desc=f"Loading preset {name}…")
        try:
            with holder.using(name) as models:  # what holder.get does, plus the calibration
                holder.on_device(calibrate, models, book)
        except Exception as error:  # noqa: BLE001 - a failed load must not kill the UI
            if not isinstance(error, (UserError, LoadError, DeviceBusy, ConfigError)):
                log.exception("loading preset %s failed", name)
            if holder.models is not None:
                yield _preset_controls(holder.models)
            raise gr.Error(user_message(error)) from None
        yield _preset_controls(models)

    def page_opened(progress=gr.Progress(track_tqdm=True)):
        """Show what is loaded; a fresh server loads the start preset now, not at launch."""
        yield from change_preset(preset if holder.models is None else "auto", progress)

    # A reply's progress shows on the chat alone: Gradio's pending animation drawn on all twelve
    # outputs while a reply streams cost the engine 3-4% of its tokens/s (scripts/ui_overhead.py).
    streaming = dict(concurrency_id=DEVICE, show_progress_on=[ui.chat])
    chat_events = [
        ui.send.click(respond, [ui.msg, ui.turns, ui.history_log, *controls], outputs, api_name="send", **streaming),
        ui.msg.submit(respond, [ui.msg, ui.turns, ui.history_log, *controls], outputs, api_name=False, **streaming),
        ui.retry.click(retry_last, [ui.turns, ui.history_log, *controls], outputs, api_name="retry", **streaming),
    ]
    # The flag stops the engine within its round; cancelling also drops queued requests and
    # closes the generator. queue=False: the stop must not wait behind what it stops.
    ui.stop.click(stop_reply, [ui.stats, ui.msg, ui.turns], [ui.stats, ui.msg, ui.chat, ui.chat_baseline, ui.turns],
                  cancels=chat_events, api_name="stop", queue=False)
    ui.clear.click(clear_all, None, outputs, cancels=chat_events, api_name="clear", queue=False)
    preset_outputs = [ui.models, ui.preset, ui.drafter, ui.draft_length, ui.adaptive]
    ui.preset.input(change_preset, ui.preset, preset_outputs, api_name="load_preset", concurrency_id=DEVICE)
    demo.load(page_opened, None, preset_outputs, api_name=False, concurrency_id=DEVICE)
    ui.compare.change(lambda on: (gr.Column(visible=on), gr.Markdown(visible=on)), ui.compare,
                      [ui.baseline_pane, ui.speedup], api_name=False, queue=False)


def _menu_drafter(drafter: str | None) -> str:
    """The drafter menu shows the menu's drafters; a preset default of none shows prompt lookup."""
    return drafter if drafter in dict((v, k) for k, v in DRAFTERS) else "prompt_lookup"


def _low_precision(model) -> str | None:
    """What the target computes in if greedy identity can break at a rounding tie there: bf16 or
    fp16 weights, or GGUF weights on int4 kernels (which compute in bf16) without row-exact
    attention (with it, a verify step breaks every tie as a 1-token step does)."""
    name = str(getattr(model, "dtype", "")).removeprefix("torch.")
    if name in ("bfloat16", "float16"):
        return name
    if not uses_row_exact_attention(model) and any(isinstance(module, Int4Linear) for module in model.modules()):
        return "bfloat16 int4 kernels"
    return None


def _models_text(holder: ModelHolder) -> str:
    return _describe(holder.models) if holder.models else R.models_markdown(None)


def _describe(models: LoadedModels) -> str:
    return R.models_markdown(models.describe(), models.notes, models.cache_line())


def _preset_choices(presets: dict) -> list[tuple[str, str]]:
    """Menu entries: the name and what running it takes (offline / download / memory)."""
    return [("auto (the best preset this machine can run)", "auto")] + [
        (f"{name} ({preset.needs()})", name) for name, preset in presets.items()
    ]


def _preset_controls(models: LoadedModels) -> tuple:
    """The models panel, and the controls reset to the loaded preset's defaults."""
    preset = models.preset
    drafter = _menu_drafter(preset.drafter)
    if (drafter == "model" and models.draft is None) or (drafter == "eagle" and models.eagle_head is None):
        drafter = "prompt_lookup"
    return (_describe(models), preset.name, drafter, preset.draft_length, preset.adaptive)


class Failed(NamedTuple):
    """What a failed reply puts back: the message box (None: leave it as it is) and the history."""

    box: str | None
    history: list


def _guarded(failed: Failed, run: Callable[[], Iterator[View]]) -> Iterator[View]:
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
        yield View(box, R.chat_view(history), R.chat_view(history, "baseline"), history,
                   gr.skip(), gr.skip(), gr.skip(), gr.skip())
        raise gr.Error(user_message(error)) from None


def _chat(holder: ModelHolder, message: str, history: list, settings: Settings,
          stop: threading.Event, meter: Meter, box: object = "", retried: dict | None = None) -> Iterator[View]:
    """One user message: load if needed, then stream the reply (or baseline then speculative).
    `box`: what the message box shows meanwhile ("" when this consumed it; gr.skip(): leave it);
    `retried`: the turn a Retry replaces (Stop before the first token puts it back)."""
    turns = [*history, R.new_turn(message, baseline_pending=settings.compare, retried=retried)]
    waiting = R.LOADING if holder.models is None else "Reading the prompt…"
    yield View(box, R.chat_view(turns), R.chat_view(turns, "baseline"), turns, waiting,
               gr.skip(), gr.skip(), gr.skip())
    try:
        with holder.using(settings.preset, cancelled=stop) as models:
            if stop.is_set():
                return
            holder.on_device(calibrate, models, meter.book)
            yield from holder.steps(_reply(models, turns, settings, stop, meter))  # each step on the device thread
    except Cancelled:  # Stop while waiting for the device or the models: a load goes on by itself
        return


def _reply(models: LoadedModels, turns: list[dict], settings: Settings, stop: threading.Event,
           meter: Meter) -> Iterator[View]:
    """Stream the reply to the last turn (or the baseline, then the speculative reply)."""
    turn = turns[-1]
    params = settings.sampling()
    prompt_ids = checked_prompt(models, turns)
    models_text = _describe(models)
    preset, context = models.preset.name, len(prompt_ids)

    def view(stats_text, plot, speedup_text, live=gr.skip(), race=gr.skip(), **final) -> View:
        # The box: Send cleared it at the start; Retry leaves it alone.
        return View(gr.skip(), R.chat_view(turns), R.chat_view(turns, "baseline"), turns, stats_text, plot,
                    speedup_text, models_text, live, race, **final)

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
    live = _LiveSpeedup(meter.book, preset, context, engine.policy.costs, baseline_reply)
    spec_points: list[tuple[float, int]] = []
    chart = S.Throttle(PLOT_INTERVAL_S, time.monotonic)

    def race():
        if baseline_reply:
            return S.race_frame(spec_points, spec_run=S.BASELINE_RUN)
        return S.race_frame(spec_points, base_points, live.rate)

    for text, markup, stats, token_ids, sources in stream_reply(engine, prompt_ids, params, stop):
        turn.update(reply=text, reply_html=markup)
        spec_points.append(S.race_point(stats))
        live_text = live.update(stats, sources)
        so_far = S.side_by_side_so_far(stats, base_stats) if base_stats else gr.skip()
        if chart.due():  # the plots and the speedup figure: twice a second is live enough
            yield view(R.stats_markdown(stats, mode), R.acceptance_frame(stats), so_far, live_text, race())
        else:
            yield view(R.stats_markdown(stats, mode), gr.skip(), so_far, gr.skip(), gr.skip())
    if stop.is_set():
        return
    if stats.get("finish_reason") == LENGTH_CONTEXT:  # say why the reply ends short
        turn.update(reply_html=markup + R.context_limit_note(engine.context_limit))

    live_text = live.finish(stats, sources)
    models_text = _describe(models)  # the kept caches' memory, after this reply
    identical = (base_ids == token_ids) if params.greedy else None
    speedup_text = (R.speedup_markdown(stats, base_stats, identical, _low_precision(engine.target_model))
                    if settings.compare else gr.skip())
    drafter = "none" if baseline_reply else dict((v, k) for k, v in DRAFTERS).get(settings.drafter, settings.drafter)
    kind = "side by side" if settings.compare else ("baseline" if baseline_reply else "speculative")
    meter.log.add(S.history_row(len(meter.log.rows) + 1, turn["user"], kind, drafter, stats, live.rate, base_stats))
    yield view(R.stats_markdown(stats, mode, done=True), R.acceptance_frame(stats), speedup_text, live_text,
               race(), history=S.history_frame(meter.log.rows), history_csv=meter.log.csv_file(),
               history_log=meter.log)


class _LiveSpeedup:
    """The #speedup-live figure of one reply: the plain rate it is compared with (chosen afresh
    at each update, as the engine's plain steps are measured) and Leviathan's prediction."""

    def __init__(self, book: S.BaselineBook, preset: str, context: int, costs, baseline_reply: bool) -> None:
        self.book, self.preset, self.context, self.costs = book, preset, context, costs
        self.baseline_reply = baseline_reply
        self.step_before = costs.target_s.get(1)  # a plain step measured before this reply
        self.rate: S.BaselineRate | None = None

    def _plain_step(self, now: float) -> S.BaselineRate | None:
        """This reply's own plain steps, if it took any (the policy's running average moved)."""
        step = self.costs.target_s.get(1)
        return S.BaselineRate.of_plain_step(step, self.context, now) if step != self.step_before else None

    def update(self, stats: dict, sources: list[str]) -> str:
        now = time.time()
        if self.baseline_reply:
            return S.live_markdown(stats, None, None, now, baseline_reply=True)
        self.rate = self.book.choose(self.preset, self.context, self._plain_step(now))
        counts = S.RoundCounts.of(sources)
        prediction = S.predict(counts, stats, self.costs.target)
        return S.live_markdown(stats, self.rate, prediction, now, counts=counts, step_s=self.costs.target(1))

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
    try:
        prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": CALIBRATION_PROMPT}])
        engine = models.engine(drafter="none")
        stats = engine.generate(prompt, SamplingParams(max_new_tokens=CALIBRATION_TOKENS)).stats.as_dict()
    except Exception:  # noqa: BLE001 - the chat must work without a calibration
        log.exception("plain-decoding calibration of %s failed", preset)
        return
    rate = S.BaselineRate.of_reply(stats, S.CALIBRATION, len(prompt), time.time())
    book.record(preset, rate)
    if rate is not None:
        log.info("calibration of %s: plain decoding %.1f tok/s (%s)", preset, rate.tokens_per_second, rate.detail)


# ---------------------------------------------------------------- launch


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Chat with a local model; watch speculative decoding work.")
    parser.add_argument("--preset", default="auto", help="preset name from models.yaml, or auto (default)")
    parser.add_argument("--config", default=None, help="a models.yaml of your own")
    parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: the whole network)")
    parser.add_argument("--port", type=int, default=7860)
    parser.add_argument("--share", action="store_true", help="also make a public gradio.live link")
    parser.add_argument("--auth", default=os.environ.get(AUTH_ENV),
                        help=f"USER:PASSWORD login in front of the app (or set {AUTH_ENV})")
    parser.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                        help="key the OpenAI-compatible API at /v1 requires as 'Authorization: Bearer KEY' "
                             f"(or set {API_KEY_ENV}); without one the API is open on 127.0.0.1 and off "
                             "when the server is reachable from elsewhere (--share, another --host)")
    parser.add_argument("--allowed-origins", default="",
                        help="comma-separated web page origins besides the app's own that may call the API "
                             "from a browser, e.g. http://localhost:3000 (others get 403)")
    parser.add_argument(RISK_FLAG, action="store_true",
                        help="serve without --auth although the app is reachable from other machines "
                             "(--share, a non-loopback --host): anyone who reaches it can generate")
    parser.add_argument("--max-new-tokens", type=int, default=256,
                        help="starting value of the slider, and the API's default max_tokens")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                        help="compiled decoding steps, compiled while the models load (default: "
                             "the preset's `compile`; auto = on with CUDA, and on CPU a 4-bit "
                             "target's steps in the background while replies start eagerly)")
    args = parser.parse_args(argv)
    if args.auth is not None:
        user, colon, password = args.auth.partition(":")
        if not (colon and user and password):  # never echo the value: it may hold a password
            _refuse("--auth takes USER:PASSWORD, both non-empty")
    if args.max_new_tokens < 1:
        parser.error("--max-new-tokens must be at least 1")
    reachable = reachable_from(args.host, args.share)
    if reachable and not args.auth and not args.insecure_no_auth:
        _refuse(f"{reachable} without --auth would let anyone who reaches it generate on this machine: add "
                f"--auth USER:PASSWORD (or set {AUTH_ENV}), or pass {RISK_FLAG} to accept that")
    args.allowed_origins = [o for o in args.allowed_origins.split(",") if o.strip()]
    return args


def _refuse(message: str) -> NoReturn:
    """A bad command line: one line on stderr and exit status 2, before anything loads."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def reachable_from(host: str, share: bool) -> str:
    """What makes the app reachable from other machines ("" if only this one can)."""
    reasons = ([f"--host {host}"] if not is_loopback(host) else []) + (["--share"] if share else [])
    return " and ".join(reasons)


def exposure_line(args: argparse.Namespace, share_url: str | None) -> str:
    """The launch line on who can use the app and Gradio's API ("" when only this machine can)."""
    where = " and ".join(([f"the network at {args.host}:{args.port}"] if not is_loopback(args.host) else [])
                         + ([f"the public link {share_url}"] if share_url else []))
    if not where:
        return ""
    if args.auth:
        return f"App and Gradio's API (/gradio_api) reachable from {where}, behind the --auth login."
    return (f"Warning ({RISK_FLAG}): anyone who reaches {where} can chat and generate through the app and "
            "Gradio's API (/gradio_api), no login.")


def launch(demo: gr.Blocks, args: argparse.Namespace, api: list | None = None,
           access: ApiAccess | None = None) -> None:
    """Serve until interrupted, with the API's routes on the same server. A failed share link
    is one line; the app keeps serving locally."""
    auth = tuple(args.auth.split(":", 1)) if args.auth else None
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):  # gradio explains a failed share link in ten lines
        demo.launch(server_name=args.host, server_port=args.port, share=args.share, auth=auth,
                    prevent_thread_lock=True, app_kwargs={"routes": list(api or [])})
    launch_text = printed.getvalue()
    if args.share and not demo.share_url:
        launch_text = launch_text.split("\nCould not create share link")[0].rstrip() + "\n"
        launch_text += (f"Could not create a share link (no network or tunnel blocked); "
                        f"still serving locally at {demo.local_url}\n")
    exposure = exposure_line(args, demo.share_url)
    if exposure:
        launch_text += exposure + "\n"
    if access is not None:
        launch_text += access.launch_line(demo.local_url) + "\n"
    print(launch_text, end="", flush=True)
    demo.block_thread()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        holder = ModelHolder(args.config, loader=functools.partial(load_preset, compile=args.compile),
                             start_preset=args.preset)
        demo = build_ui(args.preset, args.config, args.max_new_tokens, holder=holder)
        access = access_for(args.host, args.share, args.api_key, args.allowed_origins)
        api = api_routes(holder, load_presets(args.config), access, args.max_new_tokens)
    except (ValueError, FileNotFoundError) as error:  # ConfigError is a ValueError
        print(f"error: {error}", file=sys.stderr)
        return 2
    launch(demo, args, api, access)
    return 0


if __name__ == "__main__":
    sys.exit(main())
