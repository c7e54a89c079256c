"""Where everything sits in the chat app: the chat, the live numbers, the history and the
settings, each with its element id (contracts: tests and users' scripts find them by id)."""

from __future__ import annotations

from types import SimpleNamespace

import gradio as gr

from specdec_core.policy import DRAFT_LENGTH_BOUNDS
from specdec_core.presets.config import CUSTOM, menu_label
from specdec_core.presets.loaded import LoadedModels

from . import history as H
from . import render as R
from . import speedup as S
from .reply import describe
from .settings import MENU_DRAFTERS


def place(presets: dict, preset: str, max_new_tokens: int) -> SimpleNamespace:
    """Place the components (inside a gr.Blocks); returns them by name."""
    start = presets.get(preset)
    # A session's history CSV folder goes when gradio drops the session's state (an hour after
    # its tab closed; see View.history_log); what is left at exit goes with the process's folder.
    ui = SimpleNamespace(turns=gr.State([]),
                         history_log=gr.State(H.ReplyHistory(), delete_callback=H.ReplyHistory.remove_files))
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
            # The last tree round of a reply that verified trees (empty otherwise)
            ui.tree = gr.HTML(R.tree_html(None), elem_id="tree")
            ui.plot = gr.BarPlot(R.acceptance_frame(None), x="position", y="acceptance", y_lim=[0, 1],
                                 title="Acceptance by draft position", x_title="draft position",
                                 y_title="accepted share", height=220, elem_id="acceptance-plot")
            ui.models = gr.Markdown(R.models_markdown(None), elem_id="models")
    with gr.Accordion("This session's replies", open=True):
        ui.history = gr.Dataframe(H.history_frame([]), elem_id="history", interactive=False, wrap=True)
        ui.history_csv = gr.DownloadButton("Download the history as CSV", elem_id="history-csv", size="sm")
    with gr.Accordion("Settings", open=True):
        with gr.Row():
            ui.preset = gr.Dropdown(preset_choices(presets), value=preset, label="Preset", elem_id="preset")
            ui.drafter = gr.Dropdown(MENU_DRAFTERS, value=menu_drafter(start.drafter if start else None),
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


def menu_drafter(drafter: str | None) -> str:
    """The drafter menu shows the menu's drafters; a preset default of none shows prompt lookup."""
    return drafter if drafter in dict(MENU_DRAFTERS).values() else "prompt_lookup"


def preset_choices(presets: dict) -> list[tuple[str, str]]:
    """Menu entries: the name and what running it takes (offline / download / memory); the preset
    --target made shows its models instead, "custom (SmolLM2-135M-Instruct.Q4_1, draft ...)"."""
    return [("auto (the best preset this machine can run)", "auto")] + [
        (menu_label(preset) if name == CUSTOM else f"{name} ({preset.needs()})", name)
        for name, preset in presets.items()
    ]


def preset_controls(models: LoadedModels) -> tuple:
    """The models panel, and the controls reset to the loaded preset's defaults."""
    preset = models.preset
    drafter = menu_drafter(preset.drafter)
    if ((drafter == "model" and models.draft is None) or (drafter == "eagle" and models.eagle_head is None)
            or (drafter == "medusa" and models.medusa_heads is None)):
        drafter = "prompt_lookup"
    return (describe(models), preset.name, drafter, preset.draft_length, preset.adaptive)
