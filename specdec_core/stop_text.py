"""OpenAI's stop rule over a reply's text: the reply ends before the first stop string."""

from __future__ import annotations


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
        if not self._stops:  # (every reply of the app: nothing to hold back, nothing to keep)
            return piece
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
