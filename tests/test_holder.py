"""The shared model holder: turns on the device in arrival order, at most MAX_WAITING waiting,
and every piece of device work on one dedicated thread (no models needed: a fake loader)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from specdec_core.errors import DeviceBusy, QueueFull
from specdec_core.presets.holder import MAX_WAITING, Cancelled, ModelHolder, Turns
from tests.device_watch import turn_held


def fake_holder(threads: list[str]) -> ModelHolder:
    def loader(preset, config_path):
        threads.append(threading.current_thread().name)
        return SimpleNamespace(preset=SimpleNamespace(name=preset))

    def unloader(models):
        threads.append(threading.current_thread().name)

    return ModelHolder(loader=loader, unloader=unloader)


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_turns_are_served_in_arrival_order():
    turns, order, waiters = Turns(), [], []

    def take(n):
        with turns.turn():
            order.append(n)

    with turn_held(turns):
        for n in range(5):  # each joins the queue before the next starts
            waiters.append(threading.Thread(target=take, args=(n,)))
            waiters[-1].start()
            wait_until(lambda: turns.waiting == n + 1)
    for thread in waiters:
        thread.join(10)
    assert order == [0, 1, 2, 3, 4]


def test_one_more_than_max_waiting_is_refused_at_once():
    turns, release = Turns(), threading.Event()

    def hold():
        with turns.turn():
            release.wait(10)

    threads = [threading.Thread(target=hold) for _ in range(MAX_WAITING + 1)]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: turns.waiting == MAX_WAITING)
        with pytest.raises(QueueFull, match="16 requests are already waiting"):
            with turns.turn():
                pass
    finally:
        release.set()
        for thread in threads:
            thread.join(10)
    assert turns.waiting == 0


def test_a_waiter_that_gives_up_leaves_its_place_and_the_next_still_gets_its_turn():
    turns, release, gave_up, served = Turns(), threading.Event(), threading.Event(), []

    def hold():
        with turns.turn():
            release.wait(10)

    def give_up():
        with pytest.raises(Cancelled):
            with turns.turn(cancelled=gave_up):
                served.append("gave up")

    def take():
        with turns.turn():
            served.append("next")

    threads = [threading.Thread(target=f) for f in (hold, give_up)]
    for thread in threads:
        thread.start()
    wait_until(lambda: turns.waiting == 1)
    threads.append(threading.Thread(target=take))
    threads[-1].start()
    wait_until(lambda: turns.waiting == 2)
    gave_up.set()
    wait_until(lambda: turns.waiting == 1)
    release.set()
    for thread in threads:
        thread.join(10)
    assert served == ["next"]


def test_a_turn_that_never_comes_says_busy():
    turns = Turns()
    with turn_held(turns), pytest.raises(DeviceBusy, match="try again"):
        with turns.turn(timeout=0.2):
            pass


def test_all_device_work_runs_on_one_thread():
    """Loading, every step of a generation, its cleanup and unloading: one thread, whichever
    thread asks (gradio runs a reply's steps on different worker threads)."""
    threads: list[str] = []
    holder = fake_holder(threads)

    def generation():
        try:
            for n in range(3):
                threads.append(threading.current_thread().name)
                yield n
        finally:
            threads.append(threading.current_thread().name)

    with holder.using("a") as models:
        assert models.preset.name == "a"
        steps = holder.steps(generation())
        pulled = []
        for _ in range(2):  # each step pulled from a different thread
            worker = threading.Thread(target=lambda: pulled.append(next(steps)))
            worker.start()
            worker.join(10)
        steps.close()  # closed early: the generator's cleanup runs on the device thread too
        assert pulled == [0, 1]
        assert holder.on_device(lambda: threading.current_thread().name).startswith("specdec-device")
    holder.get("b")  # swapping unloads a, loads b
    holder.release()
    assert len(threads) == 7 and len(set(threads)) == 1 and threads[0].startswith("specdec-device")
    assert threading.current_thread().name not in threads


def test_errors_of_device_work_reach_the_caller():
    holder = fake_holder([])

    def failing():
        yield 1
        raise ValueError("bad step")

    with holder.using("a"):
        steps = holder.steps(failing())
        assert next(steps) == 1
        with pytest.raises(ValueError, match="bad step"):
            next(steps)


def test_auto_means_what_is_loaded_else_the_start_preset():
    loaded = []
    holder = ModelHolder(loader=lambda preset, _: loaded.append(preset) or SimpleNamespace(
        preset=SimpleNamespace(name=preset)), unloader=lambda models: None, start_preset="b")
    assert holder.get("auto").preset.name == "b"
    assert holder.get("a").preset.name == "a" and holder.get("auto").preset.name == "a"
    assert loaded == ["b", "a"]


def test_device_work_sees_the_callers_context_variables():
    """Gradio keeps an event's progress tracker in a context variable: work on the device thread
    must see it, or a load's compile bars would not reach the UI."""
    import contextvars
    import threading

    from specdec_core.presets.holder import DeviceThread

    tracker = contextvars.ContextVar("tracker", default=None)
    device = DeviceThread()
    tracker.set("event 1")
    seen = device.run(lambda: (tracker.get(), threading.current_thread().name))
    assert seen[0] == "event 1" and seen[1].startswith("specdec-device")
