"""The compiler's processes stopped while a reply decodes, so a background compile costs replies nothing.

A background compile (compiled.py) traces in Python on its own thread, which gives way to decoding
(CompiledSteps._give_way), but the C++ it generates is built by other processes: inductor's pool
of compile workers and the gcc they run. Niced, they still took half the speed of replies on two
cores (SmolLM2 4-bit: 35.7 tok/s against 68.7 eager; docs/benchmarks.md): a decoding step runs
on every core, and when one of its threads loses its core for a moment to a compiler, every
other thread of the step waits for it. A lower priority can't help with that; not running can.
So while runners decode, these processes are sent SIGSTOP (psutil's suspend), and SIGCONT once
decoding has paused: the compile then goes on where it stood, and takes longer by the time
replies took.

Only compilers are stopped: descendants of this process named as a C/C++ toolchain program, or
running inductor's compile worker. Others (a share link's tunnel, say) never are.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import psutil

logger = logging.getLogger(__name__)

# The programs a C++ build runs (gcc's driver, its compiler proper, assembler and linker) and
# clang's, as psutil names them.
TOOLCHAIN = frozenset({"gcc", "g++", "cc", "c++", "cc1", "cc1plus", "as", "ld", "collect2", "clang", "clang++"})
_WORKER = "compile_worker"  # in the command line of inductor's pool of compile workers
_TICK_S = 0.05  # how soon a reply stops the compilers, and decoding's pause resumes them
_RESCAN_S = 1.0  # while decoding: how often to look for compilers started since (a race)


def is_compiler(process: psutil.Process) -> bool:
    """Whether `process` is part of building compiled code (raises psutil.Error if it ended)."""
    return process.name() in TOOLCHAIN or any(_WORKER in part for part in process.cmdline())


def compiler_processes(is_compiler: Callable[[psutil.Process], bool] = is_compiler) -> list[psutil.Process]:
    """This process's descendants that compile, as they are now."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if is_compiler(child):
                found.append(child)
        except psutil.Error:  # it ended while we looked
            continue
    return found


class CompilerPause:
    """A thread that keeps the compiler processes stopped while `decoding()` is true, until stop().

    Stopping is idempotent and safe against processes that ended; every process it stopped is
    continued again before stop() returns, so none is left stopped for good (a stopped gcc would
    also hold the compile that waits on it)."""

    def __init__(self, decoding: Callable[[], bool], find: Callable[[], list[psutil.Process]] = compiler_processes,
                 name: str = "compiler pause") -> None:
        self._decoding = decoding
        self._find = find
        self._stopped: dict[int, psutil.Process] = {}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread; the compilers run again."""
        self._done.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    @property
    def stopped(self) -> int:
        """How many compiler processes are held stopped now."""
        return len(self._stopped)

    def _run(self) -> None:
        last_scan = None  # when decoding was last looked at for compilers (None: not decoding)
        try:
            while not self._done.wait(_TICK_S):
                if not self._decoding():
                    self._continue_all()
                    last_scan = None
                elif last_scan is None or time.monotonic() - last_scan >= _RESCAN_S:
                    self._stop_all()  # at once when a reply starts, then now and then for stragglers
                    last_scan = time.monotonic()
        except Exception:  # noqa: BLE001 - pausing is an optimisation: never take the compile down
            logger.exception("pausing the compiler processes failed; they run beside decoding")
        finally:
            self._continue_all()

    def _stop_all(self) -> None:
        for process in self._find():
            if process.pid in self._stopped:
                continue
            try:
                process.suspend()
            except psutil.Error:
                continue
            self._stopped[process.pid] = process

    def _continue_all(self) -> None:
        while self._stopped:
            _, process = self._stopped.popitem()
            try:
                process.resume()
            except psutil.Error:  # it ended (killed meanwhile)
                pass

