"""A quiet model load: what third-party libraries print while our models load, and a user can't act
on, is dropped here, narrowly (the exact messages, on their own loggers, and transformers' progress
bars only while we load). Each model we load is told in one line instead (LoadedModels.describe).

Dropped, and what each meant:
- bitsandbytes, when imported on a CPU with AVX512-BF16, tries to fetch an optional fused 4-bit
  kernel from the hub's kernels-community; offline (or not yet cached) that fails with "Failed to
  load CPU gemm_4bit_forward ... pip install kernels", and the `kernels` package first says
  "Skipping publisher trust check ... offline mode". The nf4 draft then runs on bitsandbytes' own
  built-in CPU kernel: nothing is wrong and nothing needs installing.
- transformers' "Loading weights" bars (two per model: the GGUF read and the load): a second or
  two each, and our one line per model says how long the load took.
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
    """Load models without transformers' progress bars (put back as they were afterwards) and
    without the third-party messages above."""
    from transformers.utils import logging as hf_logging

    drop_third_party_noise()
    bars_were_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if bars_were_on:
            hf_logging.enable_progress_bar()


def quietly(load: Callable[..., T]) -> Callable[..., T]:
    """`load`, run inside quiet_loading."""
    @functools.wraps(load)
    def quiet(*args, **kwargs) -> T:
        with quiet_loading():
            return load(*args, **kwargs)
    return quiet
