"""The app part: `python app.py` on a random-weight preset, one message through gradio_client:
time to first token, tokens/s, the models panel's decode path."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

from .part import Part, Scale
from .presets import write_presets


def part_app(scale: Scale, part: Part, shared: dict, out: Path) -> str | None:
    """`python app.py` on the compiled random-weight preset; one message through gradio_client."""
    missing = [m for m in ("gradio", "gradio_client") if importlib.util.find_spec(m) is None]
    if missing:
        return f"{' and '.join(missing)} not installed here"
    app_py = Path(__file__).resolve().parents[3] / "app.py"
    if not app_py.exists():
        return f"{app_py} not found (the app is not part of this install)"
    import tempfile

    config = shared.get("presets") or write_presets(scale, Path(tempfile.mkdtemp(prefix="gpu_check_app_")))
    cuda = scale.device.startswith("cuda")
    # On a CPU the app decodes eagerly (compiling there takes minutes): the check then only
    # says which path the panel shows.
    preset = "check-compiled" if cuda else "check-bf16"
    return run_app(app_py, config, preset, part, timeout_s=540 if cuda else 180, expect_compiled=cuda)


def run_app(app_py: Path, config: Path, preset: str, part: Part, timeout_s: float, expect_compiled: bool) -> str | None:
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(part_log := Path(config).parent / "app.log", "w")
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, str(app_py), "--config", str(config), "--preset", preset,
                               "--port", str(port), "--max-new-tokens", "24"], stdout=log, stderr=subprocess.STDOUT)
    try:
        client = _connect(f"http://127.0.0.1:{port}/", server, started + timeout_s)
        part.data["app_start_s"] = round(time.perf_counter() - started, 1)
        sent = time.perf_counter()
        outputs = client.predict("w10 w11 w12 w13", api_name="/send")
        part.data["reply_s"] = round(time.perf_counter() - sent, 1)
        text = json.dumps(outputs, default=str)
        part.data["outputs_tail"] = text[-2000:]
        part.check("a reply came back", "tok tok-" in text, f"reply in {part.data['reply_s']} s")
        decode = re.findall(r"decode: [a-z ,]+", text)
        part.check("models panel says decode: compiled", "decode: compiled" in text if expect_compiled else None,
                   "; ".join(dict.fromkeys(decode)) or "no decode line")
        for name in ("Time to first token", "Tokens/s"):
            part.data[name] = _panel_value(text, name)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        part.data["app_log_tail"] = part_log.read_text()[-2000:]
    return None


def _connect(url: str, server, deadline: float):
    from gradio_client import Client

    while True:
        if server.poll() is not None:
            raise RuntimeError(f"app.py exited with {server.returncode} before serving")
        try:
            return Client(url, verbose=False)
        except Exception:  # noqa: BLE001 - not up yet
            if time.perf_counter() > deadline:
                raise TimeoutError("app.py did not serve in time") from None
            time.sleep(2)


def _panel_value(text: str, name: str) -> str | None:
    """A figure of the live panel's table (`| name | value |`) in the app's outputs."""
    found = re.search(rf"\| {re.escape(name)} \| ([^|]+?) \|", text)
    return found.group(1) if found else None
