"""A model behind an OpenAI-compatible server as a bench method: vLLM, or any server that speaks
its API (this project's own does).

Each run asks for one streamed chat completion (the server applies its chat template to the
question) and reads the reply's token ids, its time to the first token and to the last. What the
target did (rounds that drafted, tokens drafted, kept at each position) comes from the server's
GET /metrics, read before and after the request: vLLM's speculative counters
(vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total, ..._num_accepted_tokens_total,
..._num_accepted_tokens_per_pos_total{position}). The bench asks one request at a time, so the
counters' growth is that request's.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

DRAFTS = "vllm:spec_decode_num_drafts_total"
DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
GENERATED = "vllm:generation_tokens_total"
# A server may count a reply a moment after its last chunk went out: wait this long at most for
# its generated-tokens counter to catch up before reading the speculative ones.
COUNTERS_SETTLE_S = 5.0
REACHABLE_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class SpecCounters:
    """The speculative counters of a server's /metrics, summed over their labels."""

    drafts: int = 0  # rounds that drafted
    draft_tokens: int = 0
    accepted: int = 0
    accepted_per_position: tuple[int, ...] = ()  # index 0: the first drafted token
    generated: int = 0

    def minus(self, before: SpecCounters) -> SpecCounters:
        """What grew since `before` (one request's share, when it ran alone)."""
        width = max(len(self.accepted_per_position), len(before.accepted_per_position))
        mine = list(self.accepted_per_position) + [0] * (width - len(self.accepted_per_position))
        theirs = list(before.accepted_per_position) + [0] * (width - len(before.accepted_per_position))
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted - before.accepted, tuple(a - b for a, b in zip(mine, theirs)),
                            self.generated - before.generated)


def parse_counters(text: str) -> SpecCounters:
    """SpecCounters from a /metrics page in Prometheus' text format. A server that never drafted
    may not list the speculative counters at all: they count 0."""
    totals: dict[str, float] = {}
    by_position: dict[int, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == ACCEPTED_PER_POSITION:
                position = int(sample.labels.get("position", 0))
                by_position[position] = by_position.get(position, 0.0) + sample.value
            elif sample.name in (DRAFTS, DRAFT_TOKENS, ACCEPTED, GENERATED):
                totals[sample.name] = totals.get(sample.name, 0.0) + sample.value
    width = max(by_position, default=-1) + 1
    return SpecCounters(
        drafts=int(totals.get(DRAFTS, 0)), draft_tokens=int(totals.get(DRAFT_TOKENS, 0)),
        accepted=int(totals.get(ACCEPTED, 0)),
        accepted_per_position=tuple(int(by_position.get(p, 0)) for p in range(width)),
        generated=int(totals.get(GENERATED, 0)),
    )


def rounds_from_counters(tokens: int, counters: SpecCounters) -> list[tuple[int, int]]:
    """(drafted, accepted) per target forward of one reply, rebuilt from its counters.

    A round keeps a prefix of its draft, so accepted_per_position[i] rounds kept at least i + 1
    tokens: sorted by what they kept, round j kept as many tokens as there are positions with more
    than j acceptances. The draft tokens are shared out evenly over the drafting rounds (vLLM drafts
    a fixed number each round; n-gram matches near the context's end draft fewer). Every forward
    yields its kept tokens plus one of its own, so the forwards are tokens - accepted; those beyond
    the drafting rounds drafted nothing (the first token, read with the prompt, is one of them)."""
    drafts = max(counters.drafts, 0)
    at_least = [min(max(a, 0), drafts) for a in counters.accepted_per_position]
    kept = [sum(1 for count in at_least if count > j) for j in range(drafts)]
    base, extra = divmod(max(counters.draft_tokens, 0), drafts) if drafts else (0, 0)
    drafting = [(max(base + (j < extra), k), k) for j, k in enumerate(kept)]
    plain = max(tokens - sum(kept) - drafts, 0)
    return drafting + [(0, 0)] * plain


@dataclass(frozen=True)
class ServedReply:
    """One streamed reply: its token ids, when they came, and the speculative counters' growth."""

    token_ids: list[int]
    wall_s: float
    ttft_s: float | None
    first_tokens: int  # tokens in the first chunk that carried any
    prompt_tokens: int | None  # usage.prompt_tokens: how many tokens the server's template made
    counters: SpecCounters

    @property
    def rounds(self) -> list[tuple[int, int]]:
        return rounds_from_counters(len(self.token_ids), self.counters)


class ServedMethod:
    """A bench method answered by an OpenAI-compatible server at `url` (its root: /v1 and /metrics
    below it). `model`: the name to ask for (None: the first the server lists). `server`: the
    process the bench started for it, if any (closed with the method). `extra`: fields added to
    every request (a server's own extensions, as this project's `speculative`)."""

    target = None  # nothing for trace_forwards to hook

    def __init__(self, name: str, url: str, model: str | None = None, server=None, timeout_s: float = 600.0,
                 extra: dict | None = None) -> None:
        self.name, self.url, self.server, self.extra = name, url.rstrip("/"), server, dict(extra or {})
        self.client = httpx.Client(timeout=timeout_s)
        self.model = model if model is not None else self.served_models()[0]
        # (prompt tokens our chat template made, prompt tokens the server read) per run: a server
        # whose template differs reads another prompt, and the report says so.
        self.prompt_tokens_seen: list[tuple[int, int | None]] = []

    def describe(self) -> dict:
        """What results.json records about this method's server."""
        differ = sorted({(ours, theirs) for ours, theirs in self.prompt_tokens_seen if ours != theirs})
        return {
            "url": self.url, "model": self.model,
            "command": None if self.server is None else self.server.command,
            "log": None if self.server is None else str(self.server.log_path),
            "prompt_tokens_differ": [{"ours": ours, "server": theirs} for ours, theirs in differ],
        }

    def served_models(self) -> list[str]:
        models = self._get("/v1/models").json().get("data") or []
        names = [m["id"] for m in models if isinstance(m, dict) and m.get("id")]
        if not names:
            raise ValueError(f"{self.name}: the server at {self.url} lists no model at /v1/models")
        return names

    def counters(self) -> SpecCounters:
        return parse_counters(self._get("/metrics").text)

    def ask(self, messages: list[dict], params) -> ServedReply:
        """One chat completion, streamed, timed from the request to its last chunk."""
        before = self.counters()
        body = {
            "model": self.model, "messages": messages, "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "stream": True,
            "stream_options": {"include_usage": True},
            # The reply's token ids: vLLM returns them with return_token_ids, this project's API
            # with return_sources (each ignores the other's field).
            "return_token_ids": True, "return_sources": True, **self.extra,
        }
        if params.top_k:
            body["top_k"] = params.top_k  # both servers' extension; 0 means off in ours, not in every server
        token_ids: list[int] = []
        ttft_s, first_tokens, usage = None, 0, {}
        started = time.perf_counter()
        with self.client.stream("POST", self.url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                raise ValueError(f"{self.name}: the server at {self.url} answered {response.status_code}: "
                                 f"{_error_message(response.read())}")
            for chunk in _events(response.iter_lines()):
                usage = chunk.get("usage") or usage
                ids = _chunk_token_ids(chunk)
                if ids and ttft_s is None:
                    ttft_s, first_tokens = time.perf_counter() - started, len(ids)
                token_ids += ids
        wall_s = time.perf_counter() - started
        if not token_ids and usage.get("completion_tokens"):
            raise ValueError(f"{self.name}: the server at {self.url} returns no token ids: it needs vLLM 0.10.2 "
                             "or later (return_token_ids), or this project's API (return_sources)")
        counters = self._settled(before, len(token_ids)).minus(before)
        if self.server is not None:  # what it does after the reply is no other method's time
            self.server.wait_until_idle()
        return ServedReply(token_ids, wall_s, ttft_s, first_tokens or 1, usage.get("prompt_tokens"), counters)

    def close(self) -> None:
        self.client.close()
        if self.server is not None:
            self.server.stop()

    def _settled(self, before: SpecCounters, tokens: int) -> SpecCounters:
        """The counters once they count the reply's tokens (or after COUNTERS_SETTLE_S)."""
        deadline = time.perf_counter() + COUNTERS_SETTLE_S
        while True:
            after = self.counters()
            if after.generated - before.generated >= tokens or time.perf_counter() > deadline:
                return after
            time.sleep(0.05)

    def _get(self, path: str) -> httpx.Response:
        try:
            response = self.client.get(self.url + path)
        except httpx.HTTPError as error:
            raise ValueError(f"{self.name}: no server answers at {self.url} ({type(error).__name__})") from None
        if response.status_code != 200:
            raise ValueError(f"{self.name}: GET {self.url}{path} answered {response.status_code}: "
                             f"{_error_message(response.content)}")
        return response


def reachable(url: str) -> bool:
    """Whether an OpenAI-compatible server answers GET /v1/models at `url` now."""
    try:
        return httpx.get(url.rstrip("/") + "/v1/models", timeout=REACHABLE_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def _events(lines):
    """The JSON payloads of a server-sent event stream, up to its [DONE]."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[len("data:"):].strip()
        if data == "[DONE]":
            return
        yield json.loads(data)


def _chunk_token_ids(chunk: dict) -> list[int]:
    """The token ids a streamed chunk adds: vLLM puts them on the choice, this project's API on
    the choice's delta."""
    ids: list[int] = []
    for choice in chunk.get("choices") or []:
        ids += choice.get("token_ids") or (choice.get("delta") or {}).get("token_ids") or []
    return ids


def _error_message(raw: bytes) -> str:
    """An OpenAI-shaped error's message, or the body's first line."""
    try:
        error = json.loads(raw).get("error")
        if isinstance(error, dict) and error.get("message"):
            return " ".join(str(error["message"]).split())
    except (ValueError, AttributeError):
        pass
    text = raw.decode("utf-8", "replace").strip()
    return text.splitlines()[0][:300] if text else "(no body)"
