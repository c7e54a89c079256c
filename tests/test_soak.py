"""Soak: 100 short generations in a row through the served app, mixing drafters, the baseline,
side by side and Stop. The process's memory afterwards stays within 10% of what it was after
the first 10, so no KV caches, engines, generators or threads leak from one reply to the next.
"""

from __future__ import annotations

import gc
import threading
import time

import psutil
from gradio_client import Client

from tests.test_app import outputs, send, token_spans

GENERATIONS = 100
WARMUP = 10

# Each kind of request the app serves; the loop cycles through them.
KINDS = [
    dict(drafter="prompt_lookup"),
    dict(drafter="model"),
    dict(baseline=True),
    dict(drafter="model", adaptive=False),
    dict(compare=True, drafter="prompt_lookup"),
    "stop",
]


def stopped_generation(client: Client) -> None:
    """Start a long reply, cancel it after its first updates (what the Stop button does)."""
    job = send(client, "Go on for a while", max_new_tokens=400, baseline=True)
    deadline = time.monotonic() + 60
    while len(job.outputs()) < 3 and not job.done():
        assert time.monotonic() < deadline, "no streamed updates"
        time.sleep(0.01)
    job.cancel()
    while not job.done():
        time.sleep(0.01)


def one_generation(client: Client, i: int) -> None:
    kind = KINDS[i % len(KINDS)]
    if kind == "stop":
        stopped_generation(client)
        return
    final = outputs(send(client, f"Message number {i}", max_new_tokens=12, **kind))
    assert token_spans(final["chat"][-1])


def rss_after_collect() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def test_memory_is_flat_over_100_generations(app_server):
    client = Client(app_server.url, verbose=False)
    threads_before = threading.active_count()
    for i in range(GENERATIONS):
        if i % 4 == 0:
            client.predict(api_name="/clear")  # keep the conversation inside the tiny context
        one_generation(client, i)
        if i + 1 == WARMUP:
            baseline_rss = rss_after_collect()
            threads_warm = threading.active_count()
    final_rss = rss_after_collect()
    growth = (final_rss - baseline_rss) / baseline_rss
    print(f"RSS after {WARMUP}: {baseline_rss / 1e6:.0f} MB, after {GENERATIONS}: {final_rss / 1e6:.0f} MB "
          f"({growth:+.1%}); threads {threads_warm} -> {threading.active_count()}")
    assert growth < 0.10, f"RSS grew {growth:.1%}: {baseline_rss / 1e6:.0f} MB -> {final_rss / 1e6:.0f} MB"
    # Threads: the server's worker pool may have grown during warm-up, never after.
    assert threading.active_count() <= max(threads_warm, threads_before) + 2
    # And the app still answers.
    assert token_spans(outputs(send(client, "still alive?", max_new_tokens=4))["chat"][-1])
