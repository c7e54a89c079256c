"""The API's Prometheus metrics (GET /metrics): requests, tokens, latencies and the speculative
counters, named as vLLM's server names them, so dashboards and alerts written for it read ours.

Each server has a registry of its own (not prometheus_client's global one): two servers in one
process, as the tests run, count apart. docs/api.md says what each metric means.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import choose_encoder


class EndedReply(Protocol):
    """What the metrics read of a reply as it ends (a serve.completion.Completion)."""

    models: Any  # LoadedModels: .preset.name labels the series
    drafter: str
    finish_reason: str | None
    stats: Any  # events.Stats
    prompt_ids: list[int]
    completion_tokens: int
    arrived: float
    first_token_at: float | None
    last_token_at: float | None


# The `_created` timestamp series prometheus_client adds to every counter and histogram double
# the output and no dashboard reads them (vLLM turns them off too). The switch is the library's
# own, process-wide; nothing else in this process exports metrics.
disable_created_metrics()

LABELS = ("model_name", "drafter")
# Seconds. A tiny model's first token comes in milliseconds, a 4-bit 8B model's on a CPU in seconds.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0, 2.5)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
ABORT = "abort"  # vLLM's finished_reason for a request that ended before its reply did


class ServerMetrics:
    """The counters and histograms of one API server, and their text for a scrape."""

    def __init__(self, waiting: Callable[[], int] | None = None) -> None:
        """waiting: how many generations wait for the device now (a gauge read at each scrape)."""
        self.registry = CollectorRegistry()

        def counter(name: str, doc: str, *extra: str) -> Counter:
            return Counter(name, doc, [*LABELS, *extra], registry=self.registry)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, doc, LABELS, buckets=buckets, registry=self.registry)

        self.requests = counter("vllm:request_success", "Chat completions ended, by finish reason.",
                                "finished_reason")
        self.prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of the requests (their usage.prompt_tokens).")
        self.generation_tokens = counter("vllm:generation_tokens", "Tokens generated (usage.completion_tokens).")
        self.ttft = histogram("vllm:time_to_first_token_seconds",
                              "From a request's arrival (its wait for the device included) to its first token.",
                              TTFT_BUCKETS)
        self.tpot = histogram("vllm:time_per_output_token_seconds",
                              "A reply's mean time per token after its first.", TPOT_BUCKETS)
        self.e2e = histogram("vllm:e2e_request_latency_seconds", "From a request's arrival to its last token.",
                             E2E_BUCKETS)
        self.drafts = counter("vllm:spec_decode_num_drafts", "Rounds in which the drafter proposed tokens.")
        self.draft_tokens = counter("vllm:spec_decode_num_draft_tokens", "Draft tokens proposed.")
        self.accepted_tokens = counter("vllm:spec_decode_num_accepted_tokens", "Draft tokens the target accepted.")
        self.accepted_per_position = counter("vllm:spec_decode_num_accepted_tokens_per_pos",
                                             "Draft tokens accepted at each position of a draft (0 = its first token).",
                                             "position")
        if waiting is not None:
            Gauge("vllm:num_requests_waiting", "Generations (API requests and UI replies) waiting for the device.",
                  registry=self.registry).set_function(waiting)

    def record(self, reply: EndedReply) -> None:
        """Count one completion, once, when it ends (finished, cut short, or failed)."""
        labels = {"model_name": reply.models.preset.name, "drafter": reply.drafter}
        # A reply the engine did not end (the client left, the generation failed) is an abort.
        ended = reply.finish_reason if reply.stats.finish_reason is not None else None
        self.requests.labels(**labels, finished_reason=ended or ABORT).inc()
        self.prompt_tokens.labels(**labels).inc(len(reply.prompt_ids))
        self.generation_tokens.labels(**labels).inc(reply.completion_tokens)
        ttft, tpot, e2e = _latencies(reply)
        if ttft is not None:
            self.ttft.labels(**labels).observe(ttft)
        if tpot is not None:
            self.tpot.labels(**labels).observe(tpot)
        self.e2e.labels(**labels).observe(e2e)
        stats = reply.stats
        self.drafts.labels(**labels).inc(stats.drafts)
        self.draft_tokens.labels(**labels).inc(stats.drafted_tokens)
        self.accepted_tokens.labels(**labels).inc(stats.accepted_tokens)
        for position, accepted in enumerate(stats.accepted_by_position):  # 0-based, as vLLM's
            self.accepted_per_position.labels(**labels, position=str(position)).inc(accepted)

    def scrape(self, accept: str | None) -> tuple[bytes, str]:
        """The metrics' text and its content type, in the format the scraper's Accept asks for
        (Prometheus' text format unless it asks for OpenMetrics)."""
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type


def _latencies(reply: EndedReply) -> tuple[float | None, float | None, float]:
    """Time to first token, mean time per token after it (None without two tokens), and the
    time from arrival to the last token (to now, for a reply that gave none)."""
    first, last = reply.first_token_at, reply.last_token_at
    ttft = first - reply.arrived if first is not None else None
    tokens_after_first = reply.completion_tokens - 1
    tpot = (last - first) / tokens_after_first if first is not None and tokens_after_first > 0 else None
    return ttft, tpot, (last if last is not None else time.perf_counter()) - reply.arrived
