"""The retrieval drafter: prompt lookup, and where the conversation holds no match, what the target
itself most often wrote next, looked up in a datastore of its own replies (REST, He et al., arXiv
2311.08252; SuffixDecoding, arXiv 2411.04975, keeps both kinds of store too).

The datastore is one stream of token ids: the target's replies to the trainer's prompts
(train/data.py writes them; build_datastore keeps their token ids), each after its prompt's last
tokens. For every n-gram of ORDERS tokens in it, the index keeps the token that most often
followed it. A round drafts one token at a time: the longest n-gram ending the context that the
index holds gives the next token, which joins the context for the next lookup. A lookup is a
binary search per order (numpy), so drafting costs next to nothing beside a target step.

The conversation comes first: where its last tokens occurred before in it, what followed them
there is the draft (prompt lookup), and the datastore drafts only where that finds nothing. Alone,
the datastore guesses new kinds of prompts far less often than prompt lookup copies; as its
fallback it adds accepted drafts (docs/training.md, "A retrieval datastore").

Deterministic, like prompt lookup: each q is one-hot, and the acceptance rule keeps sampled
output exactly the target's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import torch

from ..drafter import Draft, Drafter
from ..errors import LoadError
from ..sampling import SamplingParams
from .lookup import PromptLookupDrafter

ORDERS = (2, 3, 4, 5)  # the n-gram sizes indexed; a lookup tries the longest first
PROMPT_TAIL = 8  # prompt tokens kept before each reply: its first tokens follow the chat template's
FORMAT = "specdec-retrieval"
TOKENS_FILE, CONFIG_FILE = "tokens.npz", "config.json"

_SEPARATOR = np.uint32(2**32 - 1)  # between sequences: no n-gram spans it
_MULTIPLIER = 0x9E3779B97F4A7C15  # of the n-gram hash (Fibonacci hashing), mod 2^64
_MASK = 2**64 - 1


class Datastore:
    """Token sequences as one stream, indexed by n-gram: next_token(context) is the token that
    most often followed the longest of the context's last ORDERS tokens seen in the stream."""

    def __init__(self, stream: np.ndarray) -> None:
        self.stream = np.asarray(stream, dtype=np.uint32)
        real = self.stream[self.stream != _SEPARATOR]
        self.tokens = len(real)
        self.largest_token = int(real.max(initial=0))
        self._index = {n: _index(self.stream, n) for n in ORDERS}

    @classmethod
    def from_sequences(cls, sequences) -> Datastore:
        parts = []
        for sequence in sequences:
            parts += [np.asarray(sequence, dtype=np.uint32), np.array([_SEPARATOR])]
        return cls(np.concatenate(parts) if parts else np.array([_SEPARATOR], dtype=np.uint32))

    def memory_bytes(self) -> int:
        """Bytes of the stream and its index."""
        return self.stream.nbytes + sum(keys.nbytes + followers.nbytes for keys, followers in self._index.values())

    def next_token(self, context: list[int]) -> int | None:
        """The most frequent follower of the longest n-gram ending `context` that the stream
        holds (ties: the smaller token id), or None."""
        for n in reversed(ORDERS):
            if len(context) < n:
                continue
            keys, followers = self._index[n]
            key = _hash(context[-n:])
            at = int(np.searchsorted(keys, np.uint64(key)))
            if at < len(keys) and int(keys[at]) == key:
                return int(followers[at])
        return None

    def save(self, folder: Path, about: dict) -> None:
        """The stream (compressed) and a config.json of the format and `about` (its source)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(folder / TOKENS_FILE, stream=self.stream)
        config = {"format": FORMAT, "orders": list(ORDERS), "tokens": self.tokens, **about}
        (folder / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def load(cls, folder: Path) -> Datastore:
        """LoadError (one line) for a folder that holds no datastore of this format."""
        folder = Path(folder)
        try:
            config = json.loads((folder / CONFIG_FILE).read_text())
            with np.load(folder / TOKENS_FILE) as saved:
                stream = saved["stream"]
        except (OSError, ValueError, KeyError) as error:
            raise LoadError(f"retrieval datastore {folder} can't be read ({type(error).__name__}): build it with "
                            "python -m specdec_core.train_retrieval") from None
        if config.get("format") != FORMAT:
            raise LoadError(f"{folder / CONFIG_FILE} is not a {FORMAT} datastore: build one with "
                            "python -m specdec_core.train_retrieval")
        return cls(stream)


class RetrievalDrafter(Drafter):
    """Drafts what followed the context's last tokens earlier in the context (prompt lookup), or
    else, token by token, the continuation the datastore holds."""

    name = "retrieval"

    def __init__(self, store: Datastore, source: str = "", load_s: float = 0.0) -> None:
        self.store = store
        self.source = source or "retrieval datastore"
        self.load_s = load_s
        self.lookup = PromptLookupDrafter()

    @classmethod
    def load(cls, folder, source: str = "") -> RetrievalDrafter:
        """The drafter of a datastore folder (LoadError, one line, when it holds none)."""
        started = time.perf_counter()
        store = Datastore.load(Path(folder))
        return cls(store, source=source or str(folder), load_s=time.perf_counter() - started)

    def line(self) -> str:
        """The models panel's line: what the datastore holds and what it costs."""
        return (f"retrieval datastore: {self.source}  {self.store.tokens:,} tokens  "
                f"{self.store.memory_bytes() / 1e6:,.0f} MB  n-grams of {ORDERS[0]}-{ORDERS[-1]} tokens  "
                f"loaded and indexed in {self.load_s:.1f} s")

    def bind(self, target_model, tokenizer) -> None:
        vocab = target_model.get_output_embeddings().out_features
        if self.store.largest_token >= vocab:
            raise LoadError(f"retrieval datastore {self.source} holds token ids past the target's {vocab}: "
                            "build it from this target's data")

    def propose(self, context: list[int], k: int, params: SamplingParams, generator: torch.Generator) -> Draft:
        copied = self.lookup.propose(context, k, params, generator)
        return copied if copied.tokens else Draft(self.stored_continuation(context, k))

    def stored_continuation(self, context: list[int], k: int) -> list[int]:
        """Up to k tokens, each the datastore's next token after the context and those before it."""
        tail, tokens = list(context[-ORDERS[-1]:]), []
        while len(tokens) < k:
            token = self.store.next_token(tail)
            if token is None:
                break
            tokens.append(token)
            tail = tail[1:] + [token] if len(tail) == ORDERS[-1] else tail + [token]
        return tokens


def _hash(tokens) -> int:
    key = 0
    for token in tokens:
        key = (key * _MULTIPLIER + int(token)) & _MASK
    return key


def _index(stream: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(sorted uint64 keys of the n-grams followed by a token, each one's most frequent follower)."""
    none = np.zeros(0, dtype=np.uint64), np.zeros(0, dtype=np.uint32)
    windows = len(stream) - n  # n-grams stream[i : i + n] with a token after them
    if windows <= 0:
        return none
    keys = np.zeros(windows, dtype=np.uint64)
    with np.errstate(over="ignore"):  # the hash is mod 2^64
        for j in range(n):
            keys = keys * np.uint64(_MULTIPLIER) + stream[j : j + windows].astype(np.uint64)
    followers = stream[n:]
    separators = np.concatenate([[0], np.cumsum(stream == _SEPARATOR)])
    clean = (separators[n : n + windows] - separators[:windows] == 0) & (followers != _SEPARATOR)
    keys, followers = keys[clean], followers[clean]
    if not len(keys):
        return none
    order = np.lexsort((followers, keys))
    keys, followers = keys[order], followers[order]
    # Runs of equal (key, follower), then per key the longest run (ties: the smaller follower).
    starts = np.flatnonzero(np.concatenate([[True], (keys[1:] != keys[:-1]) | (followers[1:] != followers[:-1])]))
    counts = np.diff(np.concatenate([starts, [len(keys)]]))
    run_keys, run_followers = keys[starts], followers[starts]
    best = np.lexsort((run_followers, -counts, run_keys))
    first = np.concatenate([[True], run_keys[best][1:] != run_keys[best][:-1]])
    chosen = best[first]
    return run_keys[chosen], run_followers[chosen]
