"""The chat page in a real headless Chromium: it loads, lists the model, a message gets a streamed reply
(the server's own greedy reply), the stop button ends a reply and frees the server's batch slot at once,
and a new chat starts empty.

Needs Debian's Chromium and its driver, and selenium:

    apt-get install -y chromium chromium-driver && .venv/bin/pip install selenium

and skips, saying so, without them. The browser runs with networking features off and a fresh
profile; selenium is given both binaries, so it never downloads anything.
"""

from __future__ import annotations

import os
import shutil
import time

import httpx
import pytest

from serve_helpers import LiveServer, make_server, served_model

INSTALL = "apt-get install -y chromium chromium-driver && pip install selenium"


def _binaries() -> tuple[str, str]:
    browser = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    driver = shutil.which("chromedriver")
    if browser is None or driver is None:
        pytest.skip(f"no Chromium and chromedriver installed (for this test: {INSTALL})")
    return browser, driver


@pytest.fixture
def browser(tmp_path):
    browser_path, driver_path = _binaries()
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        pytest.skip(f"selenium is not installed (for this test: {INSTALL})")
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager: never fetch a driver or browser
    options = webdriver.ChromeOptions()
    options.binary_location = browser_path
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--no-first-run", "--disable-sync", "--disable-dev-shm-usage",
                 f"--user-data-dir={tmp_path / 'profile'}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def _slow_and_endless(model, stop_ids):
    """Each forward takes 20 ms more and stop tokens are never chosen: a reply lasts until max tokens,
    long enough to press stop in the middle."""

    def hook(module, args, out):
        time.sleep(0.02)
        if out.logits is not None:
            out.logits[..., sorted(stop_ids)] = -1e9
        return out

    model.register_forward_hook(hook)
    return model


def _wait(condition, timeout=20.0, what="condition"):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_the_chat_page_streams_replies_stops_and_starts_over(browser):
    from selenium.webdriver.common.by import By

    server = make_server(served_model(max_seq_len=1024), max_batch=4)
    _slow_and_endless(server.model, server.tokenizer.stop_ids)
    with LiveServer(server) as live:
        browser.get(live.url + "/")
        find = lambda css: browser.find_element(By.CSS_SELECTOR, css)  # noqa: E731
        _wait(lambda: find("#model").get_attribute("value") == "tiny", what="the model list")

        def setting(css, value):
            field = find(css)
            field.clear()
            field.send_keys(value)

        setting("#system", "Answer briefly.")
        setting("#temperature", "0")
        setting("#max-tokens", "12")
        find("#input").send_keys("Who art thou?")
        find("#send").click()
        reply = _wait(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-state=done]"),
                      what="a finished reply")[0]
        expected = httpx.post(live.url + "/v1/chat/completions", json={
            "model": "tiny", "temperature": 0, "max_tokens": 12,
            "messages": [{"role": "system", "content": "Answer briefly."},
                         {"role": "user", "content": "Who art thou?"}]}).json()["choices"][0]["message"]["content"]
        assert reply.find_element(By.CSS_SELECTOR, ".body").get_attribute("textContent") == expected
        assert "12 tokens" in reply.find_element(By.CSS_SELECTOR, ".meta").text

        setting("#max-tokens", "600")
        find("#input").send_keys("Speak on.")
        find("#send").click()
        streaming = _wait(lambda: browser.find_elements(By.CSS_SELECTOR, ".msg.assistant[data-state=streaming]"),
                          what="a streaming reply")[0]
        body = streaming.find_element(By.CSS_SELECTOR, ".body")
        _wait(lambda: len(body.get_attribute("textContent")) > 3, what="streamed text")
        assert live.server.scheduler.running == 1
        find("#stop").click()
        _wait(lambda: streaming.get_attribute("data-state") == "stopped", what="the stopped state")
        _wait(lambda: live.server.scheduler.running == 0, timeout=3, what="the server to free the slot")
        shown = body.get_attribute("textContent")
        time.sleep(0.3)
        assert body.get_attribute("textContent") == shown and 0 < len(shown)  # nothing arrives after stop
        assert live.server.scheduler.steps < 600  # it did not run to its token limit

        find("#new-chat").click()
        assert browser.find_elements(By.CSS_SELECTOR, ".msg") == []
        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE" and "favicon" not in e["message"]]
        assert errors == []
