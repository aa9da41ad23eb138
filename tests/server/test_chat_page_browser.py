"""The chat page in a real browser (issue 43, item 3): Debian's headless Chromium, driven by
Playwright, against a live `llama-dflash serve` of the default pair on loopback.

The page loads, sends a prompt, streams the answer with accepted draft tokens marked by their
speculator (the lookup and the DSpark draft, chained), shows tokens/s, tau and the acceptance per
draft position, reruns the prompt without speculation for comparison, and logs no console error.
A screenshot of the page after the first answer is saved (LLAMA_DFLASH_SCREENSHOT, else the test's
temporary folder) and its path printed.

`make test` installs Chromium (apt-get) and sets LLAMA_DFLASH_REQUIRE_BROWSER=1 once it is there:
then a missing browser or driver fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

requests = pytest.importorskip("requests")

from llama_dflash.defaults import DefaultModelMissing, smollm2_path  # noqa: E402

pytestmark = pytest.mark.slow
REQUIRE = os.environ.get("LLAMA_DFLASH_REQUIRE_BROWSER") == "1"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: headless on a closed network: no background connections, no first-run work, no sandbox as root
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
PROMPT = "Write a Python function that returns the squares of a list of numbers, and show an example call."


def _need(reason: str) -> None:
    if REQUIRE:
        pytest.fail(f"LLAMA_DFLASH_REQUIRE_BROWSER=1 but {reason}")
    pytest.skip(reason)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    try:
        smollm2_path()
    except DefaultModelMissing as exc:
        pytest.skip(str(exc))
    port = _free_port()
    # the default pair (no --model): the lookup chained before the shipped DSpark draft, so that
    # two speculators' tokens are marked; one thread, the other core is the browser's (two threads
    # sharing two cores with Chromium ran 15x slower)
    cmd = [sys.executable, "-m", "llama_dflash.cli", "serve", "--port", str(port), "--n-threads", "1",
           "--spec-type", "lookup,draft-dspark", "--draft-tokens", "4"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(600):
            if proc.poll() is not None:
                raise RuntimeError(proc.stdout.read().decode(errors="replace"))
            try:
                if requests.get(base + "/health", timeout=1).ok:
                    break
            except requests.ConnectionError:
                time.sleep(0.1)
        else:
            raise RuntimeError("the server did not start")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def browser():
    if not os.path.exists(CHROMIUM):
        _need(f"no Chromium at {CHROMIUM} (make test installs Debian's chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the Python package playwright is not installed (pip install -e '.[browser]')")
    with sync_playwright() as p:  # (Playwright gives the browser a fresh, empty profile)
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def _screenshot_path(tmp_path: Path) -> Path:
    where = os.environ.get("LLAMA_DFLASH_SCREENSHOT")
    return Path(where) if where else tmp_path / "chat-page.png"


def test_page_streams_marked_tokens_and_figures(server, browser, tmp_path, capsys):
    page = browser.new_page(viewport={"width": 1180, "height": 760})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url}"))

    page.goto(server + "/")
    # (selectors, not wait_for_function: the page's CSP forbids the eval that would take)
    page.wait_for_selector("#model:has-text('SmolLM2')", timeout=10_000)
    page.fill("#prompt", PROMPT)
    page.fill("#max_tokens", "96")
    page.click("#send")
    page.wait_for_selector("body[data-state=answered]", timeout=60_000)

    drafts = page.locator("#answer span.draft")
    assert drafts.count() > 0, page.inner_text("#answer")
    origins = set(page.eval_on_selector_all("#answer span.draft", "els => els.map(e => e.dataset.origin)"))
    assert origins <= {"lookup", "draft-dspark"} and origins
    answer = page.inner_text("#answer")
    assert len(answer) > 20
    assert float(page.inner_text("#f-tps")) > 0
    assert float(page.inner_text("#f-tau")) > 1.0  # drafts were accepted
    assert page.locator("#positions .bar").count() >= 1
    assert "tokens/s" in page.inner_text("#server") and "tau" in page.inner_text("#server")
    for name in origins:
        assert f"accepted draft token: {name}" in page.inner_text("#legend")
    shot = _screenshot_path(tmp_path)
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    with capsys.disabled():
        print(f"\nchat page screenshot after one answer: {shot}")

    # the same prompt without speculation: the same text, no marks, a comparison line
    page.click("#rerun")
    page.wait_for_selector("#compare:has-text('without')", timeout=60_000)
    page.wait_for_selector("body[data-state=answered]", timeout=60_000)
    assert page.locator("#answer span.draft").count() == 0
    assert page.inner_text("#answer") == answer  # greedy, flash attention on: the same answer
    assert page.inner_text("#f-mode") == "no speculation" and page.inner_text("#f-tau") == "1.00"
    assert problems == [], problems
    page.close()
