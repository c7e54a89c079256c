"""A process that compiles a model's steps into the step cache while this one decodes.

Compiling in this process slowed its replies to half their eager speed (SmolLM2 4-bit on two
cores: 36 tok/s against 69-70), even with the compiling thread waiting whenever a runner decoded:
dynamo's state mid-trace costs every thread of the process. And a compile in another process,
even at nice 19, slowed them to 1-2 tok/s: each of the step's parallel kernels waits for both of
its threads, and one of them waited behind the compile's on its core. Stopped while the replies
decode (SIGSTOP on its whole process group, the compiler's workers too) and resumed once they
have been quiet for a moment, a compile in its own process left them at eager speed (65-81 tok/s,
median 71), and it goes on between replies. docs/decode-paths.md has the measurements.

The process is started from a HelperCommand (what to run; the loader's is presets/compile_helper.py)
in a process group of its own in this session: if this process ends while the helper is stopped,
the kernel resumes the orphaned group (and hangs it up), so it is never left stopped for good;
the helper also ends when it sees its parent gone.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

_POLL_S = 0.05


@dataclass(frozen=True)
class HelperCommand:
    """How to start a helper: its argument list, the bytes it reads on its standard input, and the
    file its output goes to (kept for the one line a failure logs)."""

    argv: tuple[str, ...]
    stdin: bytes
    log: Path


class HelperProcess:
    """A running helper, paused while runners decode (decoding()) and resumed `quiet_s` after."""

    def __init__(self, command: HelperCommand, quiet_s: float) -> None:
        self.command = command
        self.quiet_s = quiet_s
        self._pausable = hasattr(os, "killpg")  # elsewhere it just runs beside the replies
        self._paused = False
        self._lock = threading.Lock()
        self._last_decoded = 0.0
        command.log.parent.mkdir(parents=True, exist_ok=True)
        with command.log.open("wb") as log:
            self._process = subprocess.Popen(list(command.argv), stdin=subprocess.PIPE, stdout=log,
                                             stderr=subprocess.STDOUT,
                                             **({"process_group": 0} if self._pausable else {}))
        try:
            self._process.stdin.write(command.stdin)
            self._process.stdin.close()
        except OSError:  # it ended at once: its exit code and log say why
            pass

    def decoding(self) -> None:
        """A runner decodes now: stop the helper until they have been quiet for quiet_s."""
        self._last_decoded = time.monotonic()
        if not self._paused:
            with self._lock:
                if not self._paused:
                    self._paused = self._signal(signal.SIGSTOP) if self._pausable else False

    def wait(self, done: Callable[[], bool]) -> int | None:
        """Let the helper run (between replies) until done() or until it ends: its exit code, or
        None if done() came first."""
        while True:
            with self._lock:  # (reaped only under the lock: a signal never reaches a reused pid)
                code = self._process.poll()
            if code is not None:
                return code
            if done():
                return None
            self._resume_if_quiet()
            time.sleep(_POLL_S)

    def stop(self) -> None:
        """End the helper and its compiler processes now."""
        with self._lock:
            self._signal(getattr(signal, "SIGKILL", signal.SIGTERM))
        self._process.wait()

    def failure(self, code: int) -> str:
        """One line on a helper that ended with `code`: its last line of output, and where the rest is."""
        lines = [line for line in self.command.log.read_text(errors="replace").splitlines() if line.strip()]
        last = lines[-1].strip() if lines else "no output"
        return f"exit code {code}: {last} (all of its output in {self.command.log})"

    def _resume_if_quiet(self) -> None:
        with self._lock:
            if self._paused and time.monotonic() - self._last_decoded >= self.quiet_s:
                self._signal(signal.SIGCONT)
                self._paused = False

    def _signal(self, number: int) -> bool:
        """Send `number` to the helper's process group (its process alone where there are no
        groups); whether it was still there to get it. Call it holding the lock."""
        if self._process.returncode is not None:  # reaped: its pid may be another's now
            return False
        try:
            if self._pausable:
                os.killpg(self._process.pid, number)
            else:
                self._process.send_signal(number)
        except (ProcessLookupError, PermissionError):
            return False
        return True
