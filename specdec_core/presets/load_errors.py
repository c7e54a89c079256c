"""What loading a model can raise, turned into one line that says what to do (LoadError)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from ..errors import LoadError
from .sources import GATED, MISSING, UNREACHABLE, hub_problem_message

__all__ = ["explain_load_error", "load_errors"]


@contextmanager
def load_errors(name: str) -> Iterator[None]:
    """Turn what loading `name` can raise into a one-line LoadError; re-raise anything else."""
    try:
        yield
    except LoadError:
        raise
    except Exception as error:
        message = explain_load_error(error, name)
        if message is None:
            raise
        raise LoadError(message) from error


def explain_load_error(error: BaseException, name: str) -> str | None:
    """One line for a known failure while loading `name` (a hub id or path); None if unknown."""
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
    )

    chain = list(_exception_chain(error))
    if any(isinstance(e, GatedRepoError) for e in chain):
        return hub_problem_message(name, GATED)
    if any(isinstance(e, RepositoryNotFoundError) for e in chain):
        return hub_problem_message(name, MISSING)
    if any(isinstance(e, (LocalEntryNotFoundError, OfflineModeIsEnabled, ConnectionError)) for e in chain):
        return hub_problem_message(name, UNREACHABLE)
    if any(_is_out_of_memory(e) for e in chain):
        return (
            f"out of memory while loading {name}: use a 4-bit draft (draft_quantization: 4bit) "
            "or a smaller preset (see `python -m specdec_core presets`)"
        )
    if isinstance(error, ValueError) and "trust_remote_code" in str(error):
        return (
            f"{name} ships its own model code: set trust_remote_code: true in its preset "
            "only if you trust that code"
        )
    if isinstance(error, OSError):
        return f"could not load {name}: {_first_line(error)}"
    return None


def _exception_chain(error: BaseException) -> Iterator[BaseException]:
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "out of memory" in str(error).lower()


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
