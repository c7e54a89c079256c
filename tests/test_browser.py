"""A real headless browser (playwright driving Debian's chromium) using the chat app.

Type, send, see coloured token spans and live stats; toggle the baseline; run side by side and
see the speedup; Stop; save a screenshot. Under CI=true a missing chromium or playwright fails.

The same flow makes the README's screenshot on the real offline model:
    python -m tests.test_browser --screenshot docs/screenshot.png
"""

from __future__ import annotations

import argparse
import re
import shutil
from pathlib import Path

import pytest

from specdec_app import render as R
from tests.tiny_models import require

DEBIAN_CHROMIUM = "/usr/bin/chromium"
LAUNCH_ARGS = ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"]
LAST_REPLY = '#chat [data-testid="bot"] >> nth=-1'
TIMEOUT_MS = 180_000  # a real model's first message also loads it


def rgb(hex_colour: str) -> str:
    """#rrggbb -> the rgb(r, g, b) string computed styles use."""
    r, g, b = (int(hex_colour[i : i + 2], 16) for i in (1, 3, 5))
    return f"rgb({r}, {g}, {b})"


def set_number(page, elem_id: str, value: int | float) -> None:
    field = page.locator(f"#{elem_id} input[type=number]")
    field.fill(str(value))
    field.press("Enter")


def send_and_wait(page, message: str) -> None:
    """Send a message and wait until the reply is complete (the panel says done)."""
    page.fill("#msg textarea", message)
    page.click("#send")
    page.wait_for_function(
        "() => document.querySelector('#msg textarea').value === ''", timeout=TIMEOUT_MS)
    page.wait_for_function(
        "() => /· done/.test(document.querySelector('#stats-text').innerText)", timeout=TIMEOUT_MS)


def open_loaded(page, url: str) -> None:
    """Open the app and wait until its models panel shows the loaded target."""
    page.goto(url)
    page.wait_for_selector("#msg textarea")
    page.wait_for_function("() => document.querySelector('#models').innerText.includes('target:')",
                           timeout=TIMEOUT_MS)


def clear(page) -> None:
    page.click("#clear")
    page.wait_for_function("() => !document.querySelector('#chat .tok')", timeout=10_000)


def record_texts(page, selector: str) -> None:
    """From now on, keep every text `selector` shows, as each change of the page makes it."""
    page.evaluate("""selector => {
        const node = document.querySelector(selector);
        window.__recorded = [node.innerText];
        new MutationObserver(() => window.__recorded.push(node.innerText))
            .observe(node, {subtree: true, childList: true, characterData: true});
    }""", selector)


def recorded_texts(page) -> list[str]:
    return page.evaluate("() => window.__recorded")


def reply_spans(page) -> list[dict]:
    """class, computed background colour and exact text of each token span of the last reply."""
    return page.locator(LAST_REPLY).locator(".tok").evaluate_all(
        "spans => spans.map(s => ({cls: s.className, bg: getComputedStyle(s).backgroundColor,"
        " text: s.textContent}))")


def check_spans(spans: list[dict], sources: set[str] | None = None) -> str:
    """Every span is `tok tok-SOURCE` in its source's colour; returns the reply text."""
    assert spans, "no coloured token spans in the reply"
    for span in spans:
        classes = span["cls"].split()
        assert classes[0] == "tok" and len(classes) == 2 and classes[1].startswith("tok-"), span
        source = classes[1].removeprefix("tok-")
        assert span["bg"] == rgb(R.SOURCE_COLOURS[source]), span
        if sources is not None:
            assert source in sources, span
    return "".join(span["text"] for span in spans)


def browser_flow(page, url: str, shots: Path, message: str, max_new_tokens: int | None = None,
                 drafter: str | None = None, expected_reply: str | None = None) -> None:
    """The user's path through the app, checking what they see at each step."""
    page.goto(url)
    page.wait_for_selector("#msg textarea")
    # The legend explains every colour.
    legend = page.locator("#legend").inner_text()
    assert all(source in legend for source in R.SOURCES)
    if max_new_tokens:
        set_number(page, "max-new-tokens", max_new_tokens)
    if drafter:
        page.locator("#drafter input").click()
        page.get_by_role("option", name=drafter).click()

    # 1. Speculative reply: stats go live while it streams, then stay with the final numbers.
    # Every state the panel shows is recorded as the page changes it: a tiny model's reply can
    # stream whole between two polls of a loaded browser, and a poll would miss it went live.
    page.fill("#msg textarea", message)
    record_texts(page, "#stats-text")
    page.click("#send")
    page.wait_for_function(
        "() => /· done/.test(document.querySelector('#stats-text').innerText)", timeout=TIMEOUT_MS)
    assert any("generating" in t and "Tokens/s" in t for t in recorded_texts(page)), recorded_texts(page)[:5]
    text = check_spans(reply_spans(page))
    if expected_reply is not None:
        assert text == expected_reply  # exactly what the engine generated, in the real browser
    stats = page.inner_text("#stats")
    for figure in ("Tokens/s", "Acceptance rate", "Tokens per target forward", "Time to first token",
                   "Time drafting / verifying", "Models"):
        assert figure in stats

    # 2. Baseline: the neutral colour only, and no acceptance figures.
    page.locator("#baseline input").check()
    send_and_wait(page, message)
    check_spans(reply_spans(page), sources={"target"})
    assert "baseline" in page.inner_text("#stats-text") and "Acceptance" not in page.inner_text("#stats-text")
    page.locator("#baseline input").uncheck()

    # 3. Clear, then side by side: baseline pane, speculative pane, and the speedup figure.
    clear(page)
    page.locator("#compare input").check()
    page.wait_for_selector("#chat-baseline", state="visible")
    send_and_wait(page, message)
    page.wait_for_function(
        "() => /Speedup: \\d+\\.\\d\\d× end to end · (\\d+\\.\\d\\d×|–) decode phase/"
        ".test(document.querySelector('#speedup').innerText)", timeout=TIMEOUT_MS)
    assert "identical ✓" in page.inner_text("#speedup")
    assert re.search(r"Time to first token: baseline [\d.]+ m?s · speculative [\d.]+ m?s", page.inner_text("#speedup"))
    base_text = check_spans(
        page.locator('#chat-baseline [data-testid="bot"] >> nth=-1').locator(".tok").evaluate_all(
            "spans => spans.map(s => ({cls: s.className, bg: getComputedStyle(s).backgroundColor,"
            " text: s.textContent}))"),
        sources={"target"})
    assert base_text == check_spans(reply_spans(page))  # greedy: the same text, only faster or not
    page.screenshot(path=str(shots / "side-by-side.png"), full_page=True)


def stop_flow(page, shots: Path) -> None:
    """Clear, then stop a long reply mid-way; the panel says stopped and the next message works."""
    clear(page)  # the tiny models read 512 tokens: start a fresh conversation
    page.locator("#compare input").uncheck()
    set_number(page, "max-new-tokens", 450)
    page.fill("#msg textarea", "Keep going for a long time")
    page.click("#send")
    # Stop once the reply has begun streaming (the chat was cleared: any token span is this
    # reply's). Stopped earlier, while the prompt is read, the panel rightly says it stopped
    # before the reply started and puts the message back in the box: not this flow.
    page.wait_for_function(
        "() => document.querySelector('#stats-text').innerText.includes('generating')"
        " && document.querySelector('#chat .tok') !== null", timeout=TIMEOUT_MS)
    page.click("#stop")
    # 60 s: under CI's two workers a real model compiling beside this server delayed the panel
    # past 10 s; a stop that came too late still fails (the panel then says done, never stopped).
    page.wait_for_function(
        "() => document.querySelector('#stats-text').innerText.includes('stopped')", timeout=60_000)
    stopped_at = re.search(r"(\d+) tokens", page.inner_text("#stats-text")).group(1)
    assert int(stopped_at) < 450
    set_number(page, "max-new-tokens", 16)
    send_and_wait(page, "Short one now")
    check_spans(reply_spans(page))
    page.screenshot(path=str(shots / "after-stop.png"), full_page=True)


def find_chromium(name: str = "chromium", default: str = DEBIAN_CHROMIUM) -> str:
    """Debian's chromium; missing, the test skips, except under CI=true, where it fails."""
    path = shutil.which(name) or default
    require(Path(path).exists(), f"chromium is not installed at {path} (apt-get install chromium)")
    return path


def launch_browser(playwright):
    return playwright.chromium.launch(executable_path=find_chromium(), headless=True, args=LAUNCH_ARGS)


def test_missing_chromium_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="chromium is not installed"):
        find_chromium("no-such-browser", "/nonexistent/chromium")
    monkeypatch.setenv("CI", "")
    with pytest.raises(pytest.skip.Exception):
        find_chromium("no-such-browser", "/nonexistent/chromium")


@pytest.fixture(scope="module")
def browser():
    find_chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        require(False, "playwright is not installed (pip install playwright)")
    with sync_playwright() as playwright:
        browser = launch_browser(playwright)
        yield browser
        browser.close()


def test_chat_in_a_real_browser(app_server, browser, tmp_path):
    from specdec_core import SamplingParams
    from specdec_core.chat import chat_prompt_ids

    message = "Say <b>hi</b> & list *three* things"
    models = app_server.holder.get("tiny")
    prompt = chat_prompt_ids(models.tokenizer, [{"role": "user", "content": message}])
    expected = models.make_engine(drafter="none").generate(prompt, SamplingParams(max_new_tokens=120)).text
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    browser_flow(page, app_server.url, tmp_path, message, max_new_tokens=120, expected_reply=expected)
    stop_flow(page, tmp_path)
    assert (tmp_path / "side-by-side.png").stat().st_size > 10_000
    page.close()


def test_the_tree_view_shows_the_last_tree_round_in_a_real_browser(tree_app_server, browser, tmp_path):
    """A reply with Medusa's candidate trees (heads fitted to it): under the stats, #tree shows
    the last tree round, the kept path in the draft colour ending in the target's own token in
    its colour, the rejected branches dimmed, and the panel gives the trees' size."""
    from tests.conftest import TREE_MESSAGE

    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    try:
        open_loaded(page, tree_app_server.url)
        page.locator("#drafter input").click()
        page.get_by_role("option", name="Medusa heads").click()
        page.locator("#adaptive input").uncheck()  # every round drafts a tree
        set_number(page, "max-new-tokens", 24)
        send_and_wait(page, TREE_MESSAGE)
        page.wait_for_selector("#tree .tree-view", timeout=10_000)
        tree = tree_app_server.holder.models.engine(drafter="medusa", draft_length=4, adaptive=False).stats.last_tree
        kept = page.locator("#tree .tree-kept > .tok").evaluate_all(
            "spans => spans.map(s => getComputedStyle(s).backgroundColor)")
        assert kept == [rgb(R.SOURCE_COLOURS["draft"])] * len(tree.path) and tree.path  # an accepted path
        closing = page.locator("#tree .tree-target > .tok")
        assert closing.get_attribute("class") == f"tok tok-{tree.source}"
        assert closing.evaluate("s => getComputedStyle(s).backgroundColor") == rgb(R.SOURCE_COLOURS[tree.source])
        rejected = page.locator("#tree .tree-rejected").evaluate_all(
            "spans => spans.map(s => [getComputedStyle(s).opacity, getComputedStyle(s).backgroundColor])")
        assert len(rejected) == len(tree.tokens) - len(tree.path) >= 1
        assert all(float(opacity) < 1 and background == "rgba(0, 0, 0, 0)" for opacity, background in rejected)
        assert page.locator("#tree .tree-view").is_visible()
        assert f"{len(tree.tokens)} nodes" in page.inner_text("#tree")
        assert "Tree size (nodes verified)" in page.inner_text("#stats-text")
        page.screenshot(path=str(tmp_path / "tree.png"), full_page=True)
    finally:
        page.close()


LIVE_FIGURE = re.compile(r"Speedup now: (\d+\.\d\d)×")


def read_while_generating(page, selector: str, until: str = "done") -> list[str]:
    """The text of `selector`, read over and over while the panel says generating (each read
    counts only if the panel said generating before and after it)."""
    reads = []
    while True:
        before = page.inner_text("#stats-text")
        if until in before:
            return reads
        text = page.inner_text(selector)
        if "generating" in before and "generating" in page.inner_text("#stats-text"):
            reads.append(text)
        page.wait_for_timeout(40)


# Series name -> data points of each line drawn in #race-chart (Vega's SVG: one path per series,
# its aria-label naming the series, one M or L command per point).
RACE_SERIES_JS = """() => Object.fromEntries(Array.from(document.querySelectorAll(
    '#race-chart path[aria-roledescription="line mark"]')).map(p => [
    p.getAttribute('aria-label').split('run: ')[1], ((p.getAttribute('d') || '').match(/[ML]/g) || []).length]))"""


def race_series(page) -> dict[str, int]:
    return page.evaluate(RACE_SERIES_JS)


def wait_for_race(page, *runs: str) -> dict[str, int]:
    """Wait until each of `runs` is drawn with at least two points; the series drawn then."""
    condition = " && ".join(f"(s[{run!r}] || 0) >= 2" for run in runs)
    page.wait_for_function(f"() => {{ const s = ({RACE_SERIES_JS})(); return {condition}; }}", timeout=30_000)
    return race_series(page)


HISTORY_ROWS = "#history .virtual-body [role=row]"  # gradio's Dataframe draws its rows as a virtual list


def history_rows(page) -> int:
    return page.locator(HISTORY_ROWS).count()


def test_live_speedup_race_and_history_in_a_real_browser(app_server, browser, tmp_path):
    """The speedup panel changes while a reply streams and stays; the race chart draws the
    measured rate dashed, and both real runs in side by side, whose speedup shows before the
    speculative half ends; the history gains a row per reply and downloads as CSV; the baseline
    pane keeps one user bubble per turn."""
    import time

    target = app_server.holder.get("tiny").target
    # A slower target (20 ms a forward) so that a reply streams long enough to be read mid-way.
    hook = target.register_forward_hook(lambda *_: time.sleep(0.02))
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    try:
        page.goto(app_server.url)  # a new session: an empty chat and history
        page.wait_for_selector("#msg textarea")
        page.wait_for_function("() => document.querySelector('#models').innerText.includes('target:')",
                               timeout=TIMEOUT_MS)  # the page-open load is done
        set_number(page, "max-new-tokens", 80)
        rows_before = history_rows(page)

        # 1. A speculative reply: the live figure is read at least twice while it streams.
        page.fill("#msg textarea", "Repeat: one two three four, one two three four")
        page.click("#send")
        page.wait_for_function("() => document.querySelector('#stats-text').innerText.includes('generating')",
                               timeout=TIMEOUT_MS)
        # (the figure, a decode-rate ratio, can settle at once: the panel's rates and theory move on)
        reads = [text for text in read_while_generating(page, "#speedup-live") if LIVE_FIGURE.search(text)]
        assert len(reads) >= 2 and len(set(reads)) >= 2, reads
        page.wait_for_function("() => /· done/.test(document.querySelector('#stats-text').innerText)")
        live = page.inner_text("#speedup-live")
        assert LIVE_FIGURE.search(live) and "vs plain decoding" in live and "measured" in live
        series = wait_for_race(page, "speculative", "baseline (measured rate)")
        # a straight line from the reply's first point (after the origin), no run
        assert series["baseline (measured rate)"] == 3 and series["baseline"] <= 1
        dash = page.locator('#race-chart path[aria-roledescription="line mark"][aria-label$="run: baseline (measured rate)"]').evaluate(
            "p => getComputedStyle(p).strokeDasharray")
        assert dash not in ("", "none")  # drawn dashed
        page.wait_for_function(f"() => document.querySelectorAll('{HISTORY_ROWS}').length === {rows_before + 1}")

        # 2. A baseline reply: another history row, and the CSV downloads with both.
        page.locator("#baseline input").check()
        send_and_wait(page, "Plain now")
        page.locator("#baseline input").uncheck()
        page.wait_for_function(f"() => document.querySelectorAll('{HISTORY_ROWS}').length === {rows_before + 2}")
        with page.expect_download() as download:
            page.click("#history-csv")
        saved = tmp_path / "history.csv"
        download.value.save_as(saved)
        lines = saved.read_text().splitlines()
        assert lines[0].startswith("#,prompt,mode,drafter,tokens") and len(lines) == rows_before + 3
        assert ",baseline,none," in lines[-1]

        # 3. Three messages, side by side only for the third: one user bubble per turn in the
        # baseline pane, and the side-by-side speedup before the speculative half ends.
        clear(page)
        send_and_wait(page, "First one")
        send_and_wait(page, "Second one")
        page.locator("#compare input").check()
        page.fill("#msg textarea", "Third one, side by side")
        page.click("#send")
        page.wait_for_function(
            "() => document.querySelector('#stats-text').innerText.includes('speculative')"
            " && document.querySelector('#stats-text').innerText.includes('generating')", timeout=TIMEOUT_MS)
        so_far = [t for t in read_while_generating(page, "#speedup") if "Speedup so far" in t]
        assert so_far, "the side-by-side speedup did not show before the speculative reply ended"
        page.wait_for_function("() => /Speedup: \\d+\\.\\d\\d×/.test(document.querySelector('#speedup').innerText)",
                               timeout=TIMEOUT_MS)
        series = wait_for_race(page, "speculative", "baseline")  # both real runs
        assert series["baseline (measured rate)"] <= 1, series
        assert page.locator('#chat-baseline [data-testid="user"]').count() == 3
        assert page.locator("#chat-baseline").inner_text().count(R.NO_BASELINE) == 2
        page.screenshot(path=str(tmp_path / "speedup.png"), full_page=True)
    finally:
        hook.remove()
        page.locator("#compare input").uncheck()
        page.close()


NOW_FIGURE = re.compile(r"Speedup now: (\d+\.\d\d)× · ([\d.]+) tok/s vs plain decoding ([\d.]+) tok/s, measured "
                        r"in a baseline reply")


def test_speedup_now_is_the_decode_phase_ratio_in_a_real_browser(app_server, browser, tmp_path):
    """The "Speedup now" figure on a reply whose prompt came from the kept cache, and on one that read a long
    prompt: in both, this reply's decode rate over the plain decode rate of a baseline reply at a
    comparable length, the time to first token on a line of its own; the history row and its CSV
    carry the same figures."""
    import csv

    words = "amber birch cedar dune ember fjord grove heath inlet juniper".split()
    first, second = (" ".join(words[(i * step) % 10] for i in range(150)) for step in (3, 7))  # 270 tokens each
    page = browser.new_page(viewport={"width": 1400, "height": 1400})
    try:
        open_loaded(page, app_server.url)
        set_number(page, "max-new-tokens", 24)
        page.locator("#baseline input").check()
        send_and_wait(page, first)  # the plain rate, measured at this prompt length
        page.locator("#baseline input").uncheck()
        shown = []
        for message in (first, second):  # the kept cache holds the first prompt; the second is read whole
            clear(page)
            send_and_wait(page, message)
            live = page.inner_text("#speedup-live")
            figure, decode, plain = map(float, NOW_FIGURE.search(live).groups())
            assert figure == pytest.approx(decode / plain, rel=0.02, abs=0.01), live
            assert re.search(r"Time to first token: [\d.]+ m?s \(reading the prompt; not in the figure\)", live)
            shown.append((figure, decode, plain))
        with page.expect_download() as download:
            page.click("#history-csv")
        download.value.save_as(tmp_path / "history.csv")
        with open(tmp_path / "history.csv", newline="", encoding="utf-8") as file:
            rows = list(csv.DictReader(file))[-2:]
        for row, (figure, decode, plain) in zip(rows, shown):
            assert (float(row["speedup"]), float(row["decode tok/s"]), float(row["vs plain tok/s"])) == (
                figure, decode, plain)
            assert row["decode speedup"] == row["speedup"] and float(row["TTFT s"]) > 0
            assert row["end-to-end speedup"] == ""  # only side by side measures a plain reply end to end
    finally:
        page.close()


def make_readme_screenshot(out: Path, preset: str) -> None:
    """Run the flow on a real preset and keep the side-by-side view as the README's picture."""
    import tempfile

    from playwright.sync_api import sync_playwright

    import app
    from tests.conftest import free_port

    demo = app.build_ui(preset, max_new_tokens=96)
    demo.launch(server_name="127.0.0.1", server_port=free_port(), prevent_thread_lock=True, quiet=True)
    # Rewriting code copies much of the prompt: the case prompt lookup is made for.
    message = ("Rewrite this function with type hints and a docstring:\n\n"
               "def mean_and_spread(values):\n    total = 0\n    for v in values:\n        total += v\n"
               "    mean = total / len(values)\n    spread = max(values) - min(values)\n"
               "    return mean, spread")
    try:
        with sync_playwright() as playwright, tempfile.TemporaryDirectory() as folder:
            browser = launch_browser(playwright)
            page = browser.new_page(viewport={"width": 1400, "height": 1100})
            browser_flow(page, demo.local_url, Path(folder), message, max_new_tokens=96)
            page.locator("#chat").scroll_into_view_if_needed()
            shutil.copy(Path(folder) / "side-by-side.png", out)
            browser.close()
    finally:
        demo.close()
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--screenshot", type=Path, required=True)
    parser.add_argument("--preset", default="smollm2-135m-local")
    options = parser.parse_args()
    make_readme_screenshot(options.screenshot, options.preset)
