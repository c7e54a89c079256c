"""In a real headless browser: Retry and Send leave the message box alone unless they consumed it;
Stop during a Retry's wait keeps the turn and its reply; a page of another site can't make the API
generate, and the app's own page can."""

from __future__ import annotations

import threading

import json
import time

from tests.test_api import HI
from tests.test_api import server as api_server  # noqa: F401  (the app with its API, a pytest fixture)
from tests.test_browser import (LAUNCH_ARGS, TIMEOUT_MS, browser, check_spans, find_chromium,  # noqa: F401
                                reply_spans, send_and_wait, set_number)


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


def test_a_page_of_another_site_cannot_make_the_api_generate_and_the_apps_own_page_can(api_server, browser):
    target = api_server.holder.get("tiny").target
    forwards = []
    hook = target.register_forward_hook(lambda *_: forwards.append(1))
    api, body = api_server.api + "/chat/completions", json.dumps(HI)
    # Chromium keeps public pages from reaching 127.0.0.1 (its Local Network Access checks); Firefox
    # and Safari do not, and neither does this chromium: the server has to refuse by itself.
    permissive = browser.browser_type.launch(executable_path=find_chromium(), headless=True,
                                             args=[*LAUNCH_ARGS, "--disable-features=LocalNetworkAccessChecks"])
    page = permissive.new_page()
    try:
        # A page on another site (served by the browser's router) sends what browsers let any page
        # send without asking the server first: no-cors POSTs, text/plain and form-encoded.
        page.route("http://evil.example/", lambda route: route.fulfill(content_type="text/html", body="<p>hi</p>"))
        page.goto("http://evil.example/")
        for kind in ("text/plain", "application/x-www-form-urlencoded"):
            page.evaluate("([api, body, kind]) => fetch(api, {method: 'POST', mode: 'no-cors', body, "
                          "headers: {'Content-Type': kind}}).catch(() => null)", [api, body, kind])
        time.sleep(1.0)  # a request that got through would be generating by now
        assert forwards == [], "a page of another site made the server generate"
        # The app's own page: a same-origin JSON request works.
        page.goto(api_server.url)
        status, reply = page.evaluate(
            "async ([api, body]) => { const r = await fetch(api, {method: 'POST', body, headers: "
            "{'Content-Type': 'application/json'}}); return [r.status, await r.json()]; }", [api, body])
    finally:
        hook.remove()
        permissive.close()
    assert status == 200 and reply["usage"]["completion_tokens"] == 2 and forwards
