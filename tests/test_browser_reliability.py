"""In a real headless browser: Retry and Send leave the message box alone unless they consumed it;
Stop during a Retry's wait keeps the turn and its reply."""

from __future__ import annotations

import threading

from tests.test_browser import TIMEOUT_MS, browser, check_spans, reply_spans, send_and_wait, set_number  # noqa: F401


def wait_for_panel(page, pattern: str) -> None:
    page.wait_for_function(
        f"() => /{pattern}/.test(document.querySelector('#stats-text').innerText)", timeout=TIMEOUT_MS)


def test_retry_keeps_a_half_typed_message_and_a_failed_send_puts_its_message_back(app_server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(app_server.url)
    page.wait_for_selector("#msg textarea")
    send_and_wait(page, "First message")  # 24 new tokens (the server's default)
    first = check_spans(reply_spans(page))

    # Retry with something half-typed in the box: the reply is regenerated, the box is kept.
    set_number(page, "max-new-tokens", 20)  # so the retried reply's panel is told apart
    page.fill("#msg textarea", "half-typed next quest")
    page.click("#retry")
    wait_for_panel(page, "20 tokens · done")
    again = check_spans(reply_spans(page))
    assert again and first.startswith(again)  # greedy: the same reply, shorter
    assert page.input_value("#msg textarea") == "half-typed next quest"

    # A Send that fails (a prompt longer than the context) puts its message back, and the
    # Retry after it leaves that message in the box.
    too_long = "word " * 600
    page.fill("#msg textarea", too_long)
    page.click("#send")
    page.wait_for_selector("text=more than the model's context", timeout=TIMEOUT_MS)
    page.wait_for_function(f"() => document.querySelector('#msg textarea').value.length === {len(too_long)}",
                           timeout=TIMEOUT_MS)
    assert page.locator('#chat [data-testid="bot"]').count() == 1
    set_number(page, "max-new-tokens", 16)
    page.click("#retry")
    wait_for_panel(page, "16 tokens · done")
    assert page.input_value("#msg textarea") == too_long
    assert page.locator('#chat [data-testid="bot"]').count() == 1
    page.close()


def test_stop_while_a_retry_waits_for_the_device_keeps_the_turn_and_its_reply(app_server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1100})
    page.goto(app_server.url)
    page.wait_for_selector("#msg textarea")
    set_number(page, "max-new-tokens", 8)
    send_and_wait(page, "Name a river.")
    reply = check_spans(reply_spans(page))
    held, release = threading.Event(), threading.Event()

    def busy():  # the device busy with something else (an API request, another user)
        with app_server.holder.turns.turn():
            held.set()
            release.wait(60)

    thread = threading.Thread(target=busy)
    thread.start()
    try:
        held.wait(30)
        page.fill("#msg textarea", "half-typed")
        page.click("#retry")
        page.wait_for_function("() => !document.querySelector('#chat .tok')", timeout=TIMEOUT_MS)  # retrying
        page.click("#stop")
        wait_for_panel(page, "earlier reply is kept")
    finally:
        release.set()
        thread.join(30)
    assert page.locator('#chat [data-testid="bot"]').count() == 1
    assert check_spans(reply_spans(page)) == reply
    assert page.input_value("#msg textarea") == "half-typed"
    send_and_wait(page, "And another?")  # the next message follows the kept turn
    assert page.locator('#chat [data-testid="bot"]').count() == 2
    assert page.locator('#chat [data-testid="user"]').first.inner_text().strip() == "Name a river."
    page.close()
