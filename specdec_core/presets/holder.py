"""The one loaded preset that every user of a server shares (the app's sessions, and the API):
a machine's device holds one set of models at a time, and one generation at a time."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from ..errors import DeviceBusy
from .loading import LoadedModels, load_preset, unload

DEVICE_WAIT_S = 120.0  # longest wait for the device before saying it is busy (loads take a while)


class ModelHolder:
    """The one loaded preset, shared by every session: the device holds one set of models.

    One lock covers loading, swapping and generating. A reply holds it from start to end, so
    a new reply or a preset change never overlaps the last steps of a cancelled one (gradio
    frees the queue slot at once but closes the cancelled generator only after its current
    step). Swapping unloads the old models first, so two presets never sit in memory together.
    """

    def __init__(self, config_path: str | None = None,
                 loader: Callable[..., LoadedModels] = load_preset,
                 unloader: Callable[[LoadedModels], None] = unload) -> None:
        self._config_path = config_path
        self._loader = loader
        self._unloader = unloader
        # A plain Lock, not an RLock: a reply's steps run on different worker threads.
        self._lock = threading.Lock()
        self._models: LoadedModels | None = None

    @property
    def models(self) -> LoadedModels | None:
        return self._models

    def get(self, preset: str) -> LoadedModels:
        """The models of `preset` ("auto": whatever is loaded, else the automatic pick)."""
        with self.using(preset) as models:
            return models

    @contextlib.contextmanager
    def using(self, preset: str) -> Iterator[LoadedModels]:
        """Hold the device for one reply, with the models of `preset` (loaded if needed)."""
        with self._device():
            yield self._load_locked(preset)

    def release(self) -> None:
        with self._device():
            self._release_locked()

    @contextlib.contextmanager
    def _device(self) -> Iterator[None]:
        # A timeout instead of waiting forever on a reply that was never closed.
        if not self._lock.acquire(timeout=DEVICE_WAIT_S):
            raise DeviceBusy("The device is still busy with another reply: try again in a moment.")
        try:
            yield
        finally:
            self._lock.release()

    def _load_locked(self, preset: str) -> LoadedModels:
        current = self._models
        if current is not None and preset in ("auto", current.preset.name):
            return current
        self._release_locked()
        self._models = self._loader(preset, self._config_path)
        return self._models

    def _release_locked(self) -> None:
        if self._models is not None:
            models, self._models = self._models, None
            self._unloader(models)
