"""Incremental detokenization: text deltas that add up to decode(all ids).

Decoding token by token breaks characters that span several tokens (UTF-8 bytes split across
byte-level BPE tokens) and word-boundary spacing. We decode a short window ending at the new
token and emit only what the window adds, holding back text that ends in an incomplete
character (U+FFFD) until the next token completes it.
"""

from __future__ import annotations

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text pieces, one `push` per token."""

    def __init__(self, tokenizer) -> None:
        self._tokenizer = tokenizer
        self._ids: list[int] = []
        self._prefix_start = 0  # window start: a little context before the unread tokens
        self._read_end = 0  # ids before this index have been turned into emitted text
        self.text = ""

    def push(self, token_id: int) -> str:
        """Add one token; return the text it completes (possibly "")."""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_start : self._read_end])
        window = self._decode(self._ids[self._prefix_start :])
        if len(window) <= len(prefix) or window.endswith(_INCOMPLETE):
            return ""
        delta = window[len(prefix) :]
        self._prefix_start, self._read_end = self._read_end, len(self._ids)
        self.text += delta
        return delta

    def flush(self) -> str:
        """At the end: whatever makes `text` equal the full decode (held-back bytes, cleanup)."""
        full = self._decode(self._ids)
        delta = full[len(self.text) :] if full.startswith(self.text) else ""
        self.text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=True) if ids else ""
