"""Watching the device from a test: the target's forwards as they run, a turn held by another
thread, and the check that the engine stopped computing."""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


@contextmanager
def forwards_of(model):
    """Inside: a list that gets the time of each forward of `model` as it runs (a hook, removed
    when the block ends)."""
    times: list[float] = []
    hook = model.register_forward_hook(lambda *_: times.append(time.monotonic()))
    try:
        yield times
    finally:
        hook.remove()


def assert_no_more_forwards(forwards: list, after: str, most: int = 440) -> None:
    """After a second's grace, a second with no forward in `forwards` (a round of the tiny
    models is a few ms: work left would show in it), and fewer than `most` in all (a reply of
    450 tokens was asked for, so it did not run to its end)."""
    time.sleep(1.0)
    count = len(forwards)
    time.sleep(1.0)
    assert len(forwards) == count, f"the engine kept computing after {after}"
    assert count < most


@contextmanager
def turn_held(turns, timeout: float = 60):
    """Inside: another thread holds a turn of `turns` (as a request on the device would), until
    the block ends or `timeout` seconds pass."""
    held, release = threading.Event(), threading.Event()

    def hold():
        with turns.turn():
            held.set()
            release.wait(timeout)

    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(30)
    try:
        yield
    finally:
        release.set()
        thread.join(30)
