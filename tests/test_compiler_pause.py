"""The compiler processes of a background compile stop while a reply decodes and go on after
(specdec_core/decoding/compiler_pause.py): real gcc processes, real signals."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time

import psutil

from specdec_core.decoding.compiler_pause import CompilerPause, compiler_processes
from tests.tiny_models import require


def _until(condition, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.02)
    return False


def _stopped(processes) -> list[bool]:
    return [p.status() == psutil.STATUS_STOPPED for p in processes]


def test_compilers_stop_while_decoding_and_finish_their_build_after():
    """gcc compiling C from a pipe (gcc and its cc1 wait for input) beside a process that is no
    compiler: decoding stops the two compilers within a tick, never the other; when decoding
    pauses they run again, and the build then ends as it would have."""
    require(shutil.which("gcc") is not None, "gcc is not installed (inductor needs it too)")
    build = subprocess.Popen(["gcc", "-x", "c", "-c", "-o", "/dev/null", "-"], stdin=subprocess.PIPE)
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    decoding = threading.Event()
    pause = CompilerPause(decoding.is_set)
    try:
        assert _until(lambda: len(compiler_processes()) >= 2)  # the driver and cc1, reading the pipe
        compilers = compiler_processes()
        assert {p.pid for p in compilers} >= {build.pid} and other.pid not in {p.pid for p in compilers}
        assert not any(_stopped(compilers))
        decoding.set()
        assert _until(lambda: all(_stopped(compilers)), timeout=2.0)
        assert pause.stopped == len(compilers)
        assert not _stopped([psutil.Process(other.pid)])[0]
        decoding.clear()
        assert _until(lambda: not any(_stopped(compilers)), timeout=2.0)
        build.stdin.write(b"int answer(void) { return 42; }\n")
        build.stdin.close()
        assert build.wait(timeout=30) == 0
    finally:
        pause.stop()
        other.kill()
        build.kill()


def test_stop_leaves_no_compiler_stopped():
    """Ending the pause while a reply still decodes (the compile closed, the app exiting) continues
    every process it stopped, so none waits stopped for good."""
    require(shutil.which("gcc") is not None, "gcc is not installed (inductor needs it too)")
    build = subprocess.Popen(["gcc", "-x", "c", "-c", "-o", "/dev/null", "-"], stdin=subprocess.PIPE)
    pause = CompilerPause(lambda: True)
    try:
        assert _until(lambda: len(compiler_processes()) >= 2)
        compilers = compiler_processes()
        assert _until(lambda: all(_stopped(compilers)), timeout=2.0)
        pause.stop()
        assert not any(_stopped(compilers))
        build.stdin.close()
        assert build.wait(timeout=30) == 0
    finally:
        pause.stop()
        build.kill()
