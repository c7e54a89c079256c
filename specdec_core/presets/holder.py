"""The one loaded preset that every user of a server shares (the app's sessions, and the API):
a machine's device holds one set of models at a time, and one generation at a time.

Two pieces make that so. Turns: whoever generates (a UI reply, an API request) waits for its
turn in arrival order, and at most `max_waiting` wait. The device thread: every piece of device
work (loading, each generation step, unloading) runs on one dedicated thread, whoever asks for
it. CUDA graphs recorded on one thread fail on another (torch 2.11), and gradio runs the steps
of one reply on different worker threads, so the steps are pulled through this thread.
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TypeVar

from ..errors import DeviceBusy, LoadError, QueueFull
from .loaded import LoadedModels, unload
from .loading import load_preset

DEVICE_WAIT_S = 600.0  # longest wait for a turn before saying the device is busy (loads take a while)
MAX_WAITING = 16  # generations that may wait for the device; one more is refused (QueueFull)

T = TypeVar("T")
_END = object()


class Cancelled(Exception):
    """The caller gave up (its `cancelled` event was set) while it waited for its turn, or for
    the models to load (the load goes on, for whoever comes next)."""


class Turns:
    """Whose turn it is on the device: first come, first served, at most `max_waiting` waiting.

    The head of the queue holds the device; leaving hands it to the next in line.
    """

    def __init__(self, max_waiting: int = MAX_WAITING) -> None:
        self.max_waiting = max_waiting
        self._lock = threading.Lock()
        self._queue: collections.deque[threading.Event] = collections.deque()

    @property
    def waiting(self) -> int:
        """How many wait behind the one holding the device."""
        with self._lock:
            return max(len(self._queue) - 1, 0)

    @contextlib.contextmanager
    def turn(self, cancelled: threading.Event | None = None, timeout: float | None = None) -> Iterator[None]:
        """Wait for the device (QueueFull at once if too many wait; DeviceBusy after `timeout`;
        Cancelled once `cancelled` is set), hold it for the block, then pass it on."""
        mine = threading.Event()
        with self._lock:
            if len(self._queue) > self.max_waiting:
                raise QueueFull(f"{self.max_waiting} requests are already waiting for the device: "
                                "try again in a moment.")
            self._queue.append(mine)
            if len(self._queue) == 1:
                mine.set()
        try:
            self._wait(mine, cancelled, DEVICE_WAIT_S if timeout is None else timeout)
            yield
        finally:
            self._leave(mine)

    @staticmethod
    def _wait(mine: threading.Event, cancelled: threading.Event | None, timeout: float) -> None:
        # In short slices when the caller may give up, so a client that left frees its place soon.
        slice_s = 0.1 if cancelled is not None else timeout
        waited = 0.0
        while not mine.wait(min(slice_s, timeout - waited)):
            waited += slice_s
            if cancelled is not None and cancelled.is_set():
                raise Cancelled()
            if waited >= timeout:
                raise DeviceBusy("The device is still busy with other replies: try again in a moment.")

    def _leave(self, mine: threading.Event) -> None:
        with self._lock:
            was_head = self._queue[0] is mine
            self._queue.remove(mine)
            if was_head and self._queue:
                self._queue[0].set()


class DeviceThread:
    """One dedicated thread that runs every piece of device work, in the order it is asked for."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-device",
                                            initializer=self._mark)

    def _mark(self) -> None:
        self._local.is_device = True

    def run(self, work: Callable[..., T], *args) -> T:
        """work(*args) on the device thread (directly when already on it); its result or error.

        It runs in a copy of the caller's context variables, so what the caller's framework keeps
        there reaches it (gradio's progress tracking: the compile bars of a load show in the UI)."""
        if getattr(self._local, "is_device", False):
            return work(*args)
        return self._executor.submit(contextvars.copy_context().run, work, *args).result()

    def run_unless(self, cancelled: threading.Event | None, work: Callable[..., T], *args) -> T:
        """Like run, but the wait ends once `cancelled` is set (Cancelled); the work goes on."""
        if cancelled is None or getattr(self._local, "is_device", False):
            return self.run(work, *args)
        future: Future = self._executor.submit(work, *args)
        while True:
            try:
                return future.result(timeout=0.05)
            except FutureTimeout:
                if cancelled.is_set():
                    raise Cancelled() from None

    def steps(self, iterator: Iterator[T]) -> Iterator[T]:
        """The items of `iterator`, each computed on the device thread; closing this closes it
        there too (a generator's cleanup touches the device: it keeps or frees KV caches)."""
        try:
            while True:
                item = self.run(next, iterator, _END)
                if item is _END:
                    return
                yield item
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                self.run(close)


class ModelHolder:
    """The one loaded preset, shared by every session: the device holds one set of models.

    A reply holds its turn from start to end (`using`), so a new reply or a preset change never
    overlaps the last steps of a cancelled one (gradio frees the queue slot at once but closes
    the cancelled generator only after its current step). Swapping unloads the old models
    first, so two presets never sit in memory together. Device work inside a turn goes through
    `steps` or `on_device`.
    """

    def __init__(self, config_path=None,
                 loader: Callable[..., LoadedModels] = load_preset,
                 unloader: Callable[[LoadedModels], None] = unload,
                 max_waiting: int = MAX_WAITING, start_preset: str = "auto") -> None:
        """config_path: a models.yaml, or presets already read (a PresetFile: one with the custom
        preset of --target); start_preset: what "auto" loads when nothing is loaded (the server's
        --preset, or "custom")."""
        self._config_path = config_path
        self._start_preset = start_preset
        self._loader = loader
        self._unloader = unloader
        self._models: LoadedModels | None = None
        self._loading: str | None = None  # the preset being loaded now
        self.turns = Turns(max_waiting)
        self.device = DeviceThread()

    @property
    def models(self) -> LoadedModels | None:
        return self._models

    @property
    def loading(self) -> str | None:
        """The preset being loaded now, if any (it may go on after its waiter was cancelled)."""
        return self._loading

    def get(self, preset: str) -> LoadedModels:
        """The models of `preset` ("auto": whatever is loaded, else the start preset)."""
        with self.using(preset) as models:
            return models

    @contextlib.contextmanager
    def using(self, preset: str, cancelled: threading.Event | None = None) -> Iterator[LoadedModels]:
        """Hold the device for one reply, with the models of `preset` (loaded if needed, on the
        device thread). Raises QueueFull, DeviceBusy, Cancelled (see Turns.turn) or LoadError.
        Cancelled also ends a wait for a load at once; the load goes on, and whoever comes next
        waits for it (the device thread runs one piece of work at a time)."""
        with self.turns.turn(cancelled):
            yield self.device.run_unless(cancelled, self._load_in_turn, preset)

    def steps(self, iterator: Iterator[T]) -> Iterator[T]:
        """Pull a generation's steps through the device thread (call it inside `using`)."""
        return self.device.steps(iterator)

    def on_device(self, work: Callable[..., T], *args) -> T:
        """work(*args) on the device thread (call it inside `using`)."""
        return self.device.run(work, *args)

    def release(self) -> None:
        with self.turns.turn():
            self.device.run(self._release_in_turn)

    def _load_in_turn(self, preset: str) -> LoadedModels:
        """The models of `preset`, swapped in if needed. The old preset is unloaded first (two
        presets may not fit together); if the new one fails to load, the old one is loaded back,
        and the error says which preset is loaded now."""
        current = self._models
        if current is not None and preset in ("auto", current.preset.name):
            return current
        self._release_in_turn()
        name = self._start_preset if preset == "auto" else preset
        self._loading = name
        try:
            self._models = self._loader(name, self._config_path)
        except Exception as error:
            if current is None:
                raise
            restored = self._restore_in_turn(current.preset.name)
            raise LoadError(f"{' '.join(str(error).split())} ({restored})") from error
        finally:
            self._loading = None
        return self._models

    def _restore_in_turn(self, name: str) -> str:
        """Load preset `name` back after a failed swap; what the user is told about it."""
        try:
            self._models = self._loader(name, self._config_path)
        except Exception as error:  # noqa: BLE001 - the first failure is the one to report
            return f"and preset {name} could not be loaded back either: {' '.join(str(error).split())}"
        return f"preset {name} is still loaded"

    def _release_in_turn(self) -> None:
        if self._models is not None:
            models, self._models = self._models, None
            self._unloader(models)
