"""Does the live speedup display slow streaming? The same reply, again and again, in a real
headless chromium: with the live speedup panel, the race chart and the history shown, and with
them hidden (display: none; `--hide` picks other selectors).

    python scripts/ui_overhead.py                    # smollm2-135m-local, prompt lookup, 6 pairs

Each reply starts a fresh conversation (Clear) with the same greedy prompt, so every reply does
the same work; shown and hidden alternate (ABBA...) so drifting machine load falls on both.
Prints, per reply, the engine's tokens/s (what the panel shows; it excludes the app's own time),
the wall time from Send to the panel's "done", the UI updates the browser applied a second and the
CPU time chromium used (drawing competes with the engine for the cores); then the medians.
Needs chromium (apt-get install chromium) and playwright.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app  # noqa: E402
from tests.conftest import free_port  # noqa: E402
from tests.test_browser import launch_browser, set_number  # noqa: E402

PROMPT = "Explain how a bicycle gear system works, in detail."  # a long reply: 128 tokens
# What the live speedup display adds: its panel, the race chart and the history table.
HIDE = "#speedup-live, #race-chart, #history"
# Counts the streamed updates the browser applied: each one changes the panel's text (its token count).
COUNT_UPDATES = """() => { if (window.__observer) window.__observer.disconnect();
  window.__updates = 0; const panel = document.querySelector('#stats-text');
  let last = panel.textContent.match(/(\\d+) tokens/);
  last = last ? last[1] : null;
  window.__observer = new MutationObserver(() => {
    const now = panel.textContent.match(/(\\d+) tokens/);
    if (now && now[1] !== last) { last = now[1]; window.__updates += 1; } });
  window.__observer.observe(panel, {childList: true, subtree: true, characterData: true}); }"""


def browser_cpu_s() -> float:
    """CPU seconds used so far by this script's chromium (its own child processes only: other
    browsers on the machine don't count). The renderer draws the chart on the engine's cores."""
    import psutil

    total = 0.0
    for process in psutil.Process().children(recursive=True):
        try:
            if "chrom" in process.name():
                times = process.cpu_times()
                total += times.user + times.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total


def one_reply(page, hidden: bool, hide: str = HIDE) -> dict:
    page.click("#clear")
    page.wait_for_function("() => !document.querySelector('#chat .tok')")
    page.wait_for_timeout(1000)  # Clear's reply also empties the message box: let it land first
    style = page.add_style_tag(content=f"{hide} {{ display: none !important; }}") if hidden else None
    page.evaluate(COUNT_UPDATES)
    page.fill("#msg textarea", PROMPT)
    started, cpu_before = time.monotonic(), browser_cpu_s()
    page.click("#send")
    # textContent, not innerText: a hidden panel still holds its text.
    page.wait_for_function("() => /· done/.test(document.querySelector('#stats-text').textContent)",
                           timeout=300_000)
    wall, browser_cpu = time.monotonic() - started, browser_cpu_s() - cpu_before
    text = page.evaluate("() => document.querySelector('#stats-text').textContent")
    tokens = int(re.search(r"(\d+) tokens · done", text).group(1))
    tps = float(re.search(r"Tokens/s\s*\|?\s*([\d.]+)", text).group(1))
    updates = page.evaluate("() => window.__updates")
    if style is not None:
        style.evaluate("s => s.remove()")
    return {"hidden": hidden, "tokens": tokens, "tokens_per_s": tps, "wall_s": wall, "updates_per_s": updates / wall,
            "browser_cpu_s": browser_cpu}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="smollm2-135m-local")
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--hide", default=HIDE, help=f"CSS selectors hidden in the 'hidden' runs (default: {HIDE})")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    demo = app.build_ui(args.preset, max_new_tokens=args.max_new_tokens)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    try:
        with sync_playwright() as playwright:
            browser = launch_browser(playwright)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            page.goto(demo.local_url)
            page.wait_for_selector("#msg textarea")
            page.wait_for_function("() => document.querySelector('#models').innerText.includes('target:')",
                                   timeout=300_000)
            set_number(page, "max-new-tokens", args.max_new_tokens)
            one_reply(page, hidden=False)  # warm-up: the first reply reads the whole prompt
            order = [False, True, True, False] * ((args.pairs + 1) // 2)
            runs = [one_reply(page, hidden, args.hide) for hidden in order[: 2 * args.pairs]]
            browser.close()
    finally:
        demo.close()
    for run in runs:
        print(f"{'hidden' if run['hidden'] else 'shown '}  {run['tokens']} tokens  {run['tokens_per_s']:.1f} tok/s  "
              f"wall {run['wall_s']:.2f} s  {run['updates_per_s']:.1f} UI updates/s  "
              f"browser CPU {run['browser_cpu_s']:.2f} s")
    for hidden in (False, True):
        mine = [r for r in runs if r["hidden"] == hidden]
        print(f"median {'hidden' if hidden else 'shown '}: {statistics.median(r['tokens_per_s'] for r in mine):.1f} tok/s, "
              f"wall {statistics.median(r['wall_s'] for r in mine):.2f} s, "
              f"{statistics.median(r['updates_per_s'] for r in mine):.1f} UI updates/s, "
              f"browser CPU {statistics.median(r['browser_cpu_s'] for r in mine):.2f} s a reply")
    shown = statistics.median(r["tokens_per_s"] for r in runs if not r["hidden"])
    hidden = statistics.median(r["tokens_per_s"] for r in runs if r["hidden"])
    print(f"shown / hidden tokens/s: {shown / hidden:.3f}; load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
