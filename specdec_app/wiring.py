"""What each control does: the chat events (ChatEvents' methods) and build_ui, which places the
elements (layout.py) and connects them. Everything that uses the device shares one concurrency
group, so loading and generating take turns."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import gradio as gr

from specdec_core.errors import DeviceBusy, LoadError
from specdec_core.presets.config import ConfigError, load_presets
from specdec_core.presets.holder import ModelHolder

from . import history as H
from . import render as R
from . import speedup as S
from .layout import place, preset_controls
from .reply import Failed, UserError, calibrate, chat, describe, guarded, user_message
from .settings import CONTROLS, Meter, Settings, View
from .stops import StopRequests

log = logging.getLogger("specdec.app")

DEVICE = "device"  # one concurrency group: loading and generating share the device


def build_ui(preset: str = "auto", config_path=None, max_new_tokens: int = 256,
             holder: ModelHolder | None = None) -> gr.Blocks:
    """The chat app as a gr.Blocks (queued, not launched). Loads no model: models load on the
    first page view, the first message or a pick in the preset menu."""
    presets = load_presets(config_path)  # ConfigError here: a bad models.yaml fails at start
    if preset != "auto" and preset not in presets:
        raise ValueError(f"unknown preset {preset!r}; available: auto, {', '.join(presets)}")
    with gr.Blocks(title="Speculative decoding chat") as demo:
        ui = place(presets, preset, max_new_tokens)
        ChatEvents(ui, holder or ModelHolder(config_path), preset).connect(demo)
    demo.queue(default_concurrency_limit=1, max_size=64)
    return demo


class ChatEvents:
    """The handlers of one app's events. Every session shares the models (`holder`), the
    measured plain rates (`book`) and the stop flags; a session's own state travels in its
    gr.State elements (the turns, the history)."""

    def __init__(self, ui: SimpleNamespace, holder: ModelHolder, preset: str) -> None:
        self.ui = ui
        self.holder = holder
        self.preset = preset  # the start preset, loaded on the first page view
        self.stops = StopRequests()
        self.book = S.BaselineBook()  # every session's measured plain rates: one machine, one set of models

    def connect(self, demo: gr.Blocks) -> None:
        ui = self.ui
        controls = [getattr(ui, name) for name in CONTROLS]
        outputs = [getattr(ui, name) for name in View.names()]
        # A reply's progress shows on the chat alone: Gradio's pending animation drawn on all twelve
        # outputs while a reply streams cost the engine 3-4% of its tokens/s (scripts/ui_overhead.py).
        streaming = dict(concurrency_id=DEVICE, show_progress_on=[ui.chat])
        chat_inputs = [ui.msg, ui.turns, ui.history_log, *controls]
        chat_events = [
            ui.send.click(self.respond, chat_inputs, outputs, api_name="send", **streaming),
            ui.msg.submit(self.respond, chat_inputs, outputs, api_name=False, **streaming),
            ui.retry.click(self.retry, [ui.turns, ui.history_log, *controls], outputs, api_name="retry", **streaming),
        ]
        # The flag stops the engine within its round; cancelling also drops queued requests and
        # closes the generator. queue=False: the stop must not wait behind what it stops.
        ui.stop.click(self.stop, [ui.stats, ui.msg, ui.turns], [ui.stats, ui.msg, ui.chat, ui.chat_baseline, ui.turns],
                      cancels=chat_events, api_name="stop", queue=False)
        ui.clear.click(self.clear, None, outputs, cancels=chat_events, api_name="clear", queue=False)
        preset_outputs = [ui.models, ui.preset, ui.drafter, ui.draft_length, ui.adaptive]
        ui.preset.input(self.change_preset, ui.preset, preset_outputs, api_name="load_preset", concurrency_id=DEVICE)
        demo.load(self.page_opened, None, preset_outputs, api_name=False, concurrency_id=DEVICE)
        ui.compare.change(lambda on: (gr.Column(visible=on), gr.Markdown(visible=on)), ui.compare,
                          [ui.baseline_pane, ui.speedup], api_name=False, queue=False)

    def respond(self, request: gr.Request, message: str, history: list, log: H.ReplyHistory, *values):
        """Send: answer the message in the box."""
        if not (message or "").strip():
            raise gr.Error("Empty message: type something in the box, then press Send.")
        # Send consumed the box: a failure puts the message back.
        yield from self._reply(request, message, history, log, values, Failed(message, history))

    def retry(self, request: gr.Request, history: list, log: H.ReplyHistory, *values):
        """Retry: answer the last message again."""
        if not history:
            raise gr.Error("Nothing to retry yet: send a message first.")
        # Retry leaves the box alone, and a failure keeps the turn it retried, reply and all.
        yield from self._reply(request, history[-1]["user"], history[:-1], log, values, Failed(None, history),
                               history[-1])

    def _reply(self, request: gr.Request, message: str, history: list, log: H.ReplyHistory, values: tuple,
               failed: Failed, retried: dict | None = None):
        """Answer `message` after `history`; on failure show `failed` (the box and chat as they were).
        `retried`: the turn a Retry replaces."""
        settings = Settings.of(values)
        session = request.session_hash or ""
        run = self.stops.begin(session)
        try:
            meter = Meter(self.book, log)
            # The box is cleared only when this consumed it (Send); a failure puts it back.
            box = gr.skip() if failed.box is None else ""
            views = guarded(failed, lambda: chat(self.holder, message, history, settings, run.stop, meter, box, retried))
            try:
                for view in views:
                    yield view.values()
            finally:
                # Closed (Stop, a dropped connection): the reply's stream ends here, before the
                # stop flag's waiter is told the reply is over (StopRequests.request).
                views.close()
        finally:
            self.stops.end(session, run)

    def stop(self, request: gr.Request, panel: str, message: str, history: list):
        """Stop the session's reply. A message that got no reply at all (stopped while the
        models loaded or the prompt was read) goes back to the box, unless something new is there;
        a Retry stopped then puts back the turn it was replacing, reply and all."""
        self.stops.request(request.session_hash or "")
        if history and not history[-1]["reply"] and history[-1].get(R.RETRIED):
            history = [*history[:-1], history[-1][R.RETRIED]]
            return (R.stopped_before_retry_markdown(self.holder.loading), gr.skip(), R.chat_view(history),
                    R.chat_view(history, "baseline"), history)
        if history and not history[-1]["reply"]:
            box = message if (message or "").strip() else history[-1]["user"]
            history = history[:-1]
            return (R.stopped_before_reply_markdown(self.holder.loading), box, R.chat_view(history),
                    R.chat_view(history, "baseline"), history)
        return R.stopped_markdown(panel), gr.skip(), gr.skip(), gr.skip(), gr.skip()

    def clear(self, request: gr.Request):
        """Clear: a new conversation (a running reply stops first, so it can't refill the chat)."""
        self.stops.request(request.session_hash or "")
        models = describe(self.holder.models) if self.holder.models else R.models_markdown(None)
        return View(msg="", chat=[], chat_baseline=[], turns=[], stats=R.stats_markdown(None, "speculative"),
                    plot=R.acceptance_frame(None), speedup=R.speedup_markdown(None, None, None), models=models,
                    live=S.live_markdown(None, None, None, 0.0), race=S.race_frame([]), tree=R.tree_html(None)).values()

    def change_preset(self, name: str, progress=gr.Progress(track_tqdm=True)):
        """Load the picked preset. If it fails, the menu and panel go back to what is loaded
        (the holder loads the previous preset back), then the error shows."""
        # track_tqdm: compiling the steps (minutes on a GPU) shows its bar, shape by shape, with
        # tqdm's estimate of the time left
        progress(0, desc=f"Loading preset {name}…")
        try:
            with self.holder.using(name) as models:  # what holder.get does, plus the calibration
                self.holder.on_device(calibrate, models, self.book)
        except Exception as error:  # noqa: BLE001 - a failed load must not kill the UI
            if not isinstance(error, (UserError, LoadError, DeviceBusy, ConfigError)):
                log.exception("loading preset %s failed", name)
            if self.holder.models is not None:
                yield preset_controls(self.holder.models)
            raise gr.Error(user_message(error)) from None
        yield preset_controls(models)

    def page_opened(self, progress=gr.Progress(track_tqdm=True)):
        """Show what is loaded; a fresh server loads the start preset now, not at launch."""
        yield from self.change_preset(self.preset if self.holder.models is None else "auto", progress)
