"""What a chat event reads (Settings: the controls, by name) and what it updates (View: the
outputs, by name), and what a reply measures into (Meter)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import gradio as gr

from specdec_core import SamplingParams
from specdec_core.presets.config import DRAFTER_LABELS

from . import history as H
from . import speedup as S

# The drafters the app's menu offers ("none" is the Baseline checkbox), with their labels.
MENU_DRAFTERS = [(label, name) for name, label in DRAFTER_LABELS.items() if name != "none"]


@dataclass(frozen=True)
class Settings:
    """The control values of one chat event. The events take the controls in CONTROLS' order
    (Gradio's API for the send and retry endpoints is positional); `of` reads them by name."""

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

    @classmethod
    def of(cls, values: tuple) -> Settings:
        """The settings from the control values, which come in CONTROLS' order."""
        return cls(**dict(zip(CONTROLS, values, strict=True)))

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=float(self.temperature), top_k=int(self.top_k),
                              top_p=float(self.top_p), max_new_tokens=int(self.max_new_tokens))

    @property
    def drafter_label(self) -> str:
        return DRAFTER_LABELS.get(self.drafter, self.drafter)

    def mode(self) -> str:
        """The panel's name for the main pane's decoding."""
        if self.baseline and not self.compare:
            return "baseline"
        return f"speculative · {self.drafter_label}"


# The controls' element names, in the order the chat events take them (a contract of Gradio's API).
CONTROLS = ("preset", "drafter", "temperature", "top_p", "top_k", "max_new_tokens", "draft_length", "adaptive",
            "baseline", "compare")


@dataclass
class View:
    """Everything a chat event updates, by name; a field left out is left as it is. The event's
    outputs are the layout's elements of the same names, in this order (outputs())."""

    msg: object = field(default_factory=gr.skip)
    chat: object = field(default_factory=gr.skip)
    chat_baseline: object = field(default_factory=gr.skip)
    turns: object = field(default_factory=gr.skip)
    stats: object = field(default_factory=gr.skip)
    plot: object = field(default_factory=gr.skip)
    speedup: object = field(default_factory=gr.skip)
    models: object = field(default_factory=gr.skip)
    live: object = field(default_factory=gr.skip)  # #speedup-live
    race: object = field(default_factory=gr.skip)  # #race-chart
    history: object = field(default_factory=gr.skip)  # #history (only at a reply's end)
    history_csv: object = field(default_factory=gr.skip)  # its CSV download
    # The session's ReplyHistory, set when it wrote its CSV: gradio calls a State's delete
    # callback (which removes the CSV's folder) only for states an event has set.
    history_log: object = field(default_factory=gr.skip)
    # #tree: the last tree round (last so the API's positional outputs before it stay where they were)
    tree: object = field(default_factory=gr.skip)

    def values(self) -> tuple:
        """The fields' values in the outputs' order (no copies: a State's object stays itself)."""
        return tuple(getattr(self, f.name) for f in fields(self))

    @staticmethod
    def names() -> list[str]:
        return [f.name for f in fields(View)]


@dataclass(frozen=True)
class Meter:
    """What a reply measures into: the server's plain rates and the session's history."""

    book: S.BaselineBook
    log: H.ReplyHistory
