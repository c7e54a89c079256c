"""The chat app's UI: build_ui() is the Gradio Blocks that app.py launches.

layout.py places the elements; wiring.py connects the events; reply.py streams one reply (and
side by side's race); settings.py names what an event reads and updates; render.py and
speedup.py format the chat, the panel, the live speedup and the history (pure: they import
neither torch nor gradio, so build_ui loads on first use).
"""

from __future__ import annotations

__all__ = ["build_ui"]


def __getattr__(name: str):
    if name != "build_ui":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .wiring import build_ui

    return build_ui
