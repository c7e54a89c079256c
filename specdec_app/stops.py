"""Stop requests by browser session: the Stop button's flag, checked by the running reply."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass
class _Run:
    """One running reply: the flag it checks, and the signal that it is over."""

    stop: threading.Event = field(default_factory=threading.Event)
    ended: threading.Event = field(default_factory=threading.Event)


class StopRequests:
    """Stop requests by browser session, shared by all sessions like the models.

    The Stop button sets its session's flag and the running reply checks it after every token,
    so the engine stops within the round it is in. (Cancelling the event alone waits until the
    current batch of streamed tokens, up to reply.UPDATE_INTERVAL_S of work, is done.)
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
