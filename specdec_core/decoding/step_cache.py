"""Compiled steps kept on disk, so a later start loads them in seconds instead of compiling.

Inductor's own caches keep the generated code and its built libraries, but a start with them warm
still traces every step through dynamo (SmolLM2's 1-token step: 30 of its 60 s with a warm
inductor cache, on two loaded cores). So each step size is compiled ahead of its first call
(dynamo's `aot_compile`, the whole step one graph) and saved as one file; a later start
deserialises it and calls it, with no tracing. Its libraries are built into inductor's cache
folder, so while our steps compile or load that folder is `inductor/` under the same folder
(whatever TORCHINDUCTOR_CACHE_DIR says; set $SPECDEC_CACHE to move both): with it elsewhere, or
emptied by a reboot as /tmp is, loading would build them again (40 s for a tiny model's step).

A file is named by a key of everything the compiled code depends on: the model's structure (its
config, each module's type and plain attributes, each tensor's name, shape and dtype: weights
are inputs of the graph, not baked into it, so their values don't matter), the step size (a
tree step's file is named apart, by its node count: it takes the tree's positions and paths), the
layers whose features the step returns, the compile options, and the versions of torch,
transformers, Python, the CPU's instruction set and our own code (the source of decoding/ and
kernels/, what the steps trace). Anything else changed gives another key, so a stale file is
never loaded; one that fails to load is compiled again and replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import platform
import stat
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

_TRACED_PACKAGES = ("decoding", "kernels")  # our code a compiled step runs through
_PLAIN = (bool, int, float, str, type(None))


class StepCache:
    """The files of one model's compiled steps, one per step size, under `folder`."""

    def __init__(self, folder: Path, model, feature_layers: tuple[int, ...], options: dict) -> None:
        self.folder = Path(folder)
        self.key = step_key(model, feature_layers, options)

    def inductor_folder(self):
        """A context in which inductor keeps what it generates and builds in `inductor/` here
        (it sets TORCHINDUCTOR_CACHE_DIR for the process meanwhile, and restores it after)."""
        try:
            from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir
        except ImportError:  # another torch: inductor's own folder
            return contextlib.nullcontext()
        return temporary_cache_dir(str(self.folder / "inductor"))

    def path(self, size: int, kind: str = "step") -> Path:
        """The file of the compiled step of `size` tokens (kind "step") or of a tree step of
        `size` nodes (kind "tree": other inputs, another graph)."""
        return self.folder / f"{kind}-{self.key}-{size}.bin"

    def load(self, size: int, kind: str = "step"):
        """The saved compiled step of `size` (see path), or None (not saved yet, or unreadable)."""
        path = self.path(size, kind)
        if not path.is_file():
            return None
        try:
            with path.open("rb") as file:
                return torch.compiler.load_compiled_function(file)
        except Exception as error:  # another torch's file, a truncated one: compiled again, replaced
            logger.info("compiled step %s could not be loaded (%s): compiling it again", path.name,
                        type(error).__name__)
            return None

    def save(self, size: int, step, kind: str = "step") -> None:
        """Save a compiled step (written to a temporary file, then renamed: never half a file).
        A failure only costs the next start its compile: one log line."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            step.save_compiled_function(str(self.path(size, kind)))
            # torch writes it through a 0600 temporary file: give it the mode the umask gives
            # (mkdir applied it to the folder), so a shared $SPECDEC_CACHE stays readable to all.
            self.path(size, kind).chmod(stat.S_IMODE(self.folder.stat().st_mode) & 0o666)
        except Exception as error:
            logger.warning("compiled step could not be saved in %s (%s: %s): the next start compiles it again",
                           self.folder, type(error).__name__, error)


def step_key(model, feature_layers: tuple[int, ...], options: dict) -> str:
    """A digest of what a model's compiled steps depend on (see the module)."""
    digest = hashlib.sha256()
    for part in (_versions(), model.config.to_json_string(use_diff=False), _structure(model),
                 repr(tuple(feature_layers)), repr(sorted((k, repr(v)) for k, v in options.items()))):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()[:24]


def _versions() -> str:
    import transformers

    cpu = torch.backends.cpu.get_cpu_capability()
    return f"{torch.__version__} {transformers.__version__} {sys.version} {platform.machine()} {cpu} {code_version()}"


def code_version() -> str:
    """A digest of the source our compiled steps trace (decoding/ and kernels/)."""
    package = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for name in _TRACED_PACKAGES:
        for source in sorted((package / name).glob("*.py")):
            digest.update(source.name.encode())
            digest.update(source.read_bytes())
    return digest.hexdigest()[:16]


def _structure(model) -> str:
    """Each module's type and plain public attributes, each tensor's name, shape and dtype."""
    lines = []
    for name, module in model.named_modules():
        plain = sorted((k, v) for k, v in vars(module).items() if not k.startswith("_") and isinstance(v, _PLAIN))
        lines.append(f"{name} {type(module).__module__}.{type(module).__qualname__} {plain}")
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        lines.append(f"{name} {tuple(tensor.shape)} {tensor.dtype}")
    return "\n".join(lines)
