"""A quiet model load: what third-party libraries print while our models load, and a user can't act
on, is dropped here, narrowly (the exact messages, on their own loggers, and transformers' "Loading
weights" bars only while we load). Each model we load is told in one line instead (LoadedModels.describe).

Dropped, and what each meant:
- bitsandbytes, when imported on a CPU with AVX512-BF16, tries to fetch an optional fused 4-bit
  kernel from the hub's kernels-community; offline (or not yet cached) that fails with "Failed to
  load CPU gemm_4bit_forward ... pip install kernels", and the `kernels` package first says
  "Skipping publisher trust check ... offline mode". The nf4 draft then runs on bitsandbytes' own
  built-in CPU kernel: nothing is wrong and nothing needs installing.
- transformers' "Loading weights" bars (one or two per model): seconds each, and our one line per
  model says how long the load took. Its other bars (a hub download's) still show.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

# logger name -> the start of each message dropped from it
_DROPPED = {
    "bitsandbytes.backends.cpu.ops": ("Failed to load CPU gemm_4bit_forward from kernels-community",),
    "kernels._internals.hf_hub": ("Skipping publisher trust check for 'kernels-community/",),
}


class _DropMessages(logging.Filter):
    def __init__(self, starts: tuple[str, ...]) -> None:
        super().__init__()
        self.starts = starts

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(self.starts)


def drop_third_party_noise() -> None:
    """Filter the messages above on their loggers (once per process; before bitsandbytes is
    imported, which is when it logs). Everything else those loggers say still shows."""
    for name, starts in _DROPPED.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(starts))


@contextlib.contextmanager
def quiet_loading() -> Iterator[None]:
    """Load models without transformers' "Loading weights" bars (through its tqdm hook, put back
    afterwards; other bars, a hub download's, still show) and without the third-party messages above."""
    from transformers.utils import logging as hf_logging

    drop_third_party_noise()
    previous = None

    def no_loading_bars(factory, args, kwargs):
        if kwargs.get("desc") == "Loading weights":
            return hf_logging.EmptyTqdm(*args, **kwargs)
        return previous(factory, args, kwargs) if previous is not None else factory(*args, **kwargs)

    previous = hf_logging.set_tqdm_hook(no_loading_bars)
    try:
        yield
    finally:
        hf_logging.set_tqdm_hook(previous)


def quietly(load: Callable[..., T]) -> Callable[..., T]:
    """`load`, run inside quiet_loading."""
    @functools.wraps(load)
    def quiet(*args, **kwargs) -> T:
        with quiet_loading():
            return load(*args, **kwargs)
    return quiet
