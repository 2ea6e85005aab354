"""End to end, as a user would: start `python app.py`, drive it in headless Chromium: a finished
run (coloured tokens, charts, summary), a stopped run, a failing run, and a run after those.

Uses the built-in SmolLM2-135M-Instruct (offline; its first use converts it from GGUF, so startup
may take minutes on a busy machine). Set SPECVIZ_SCREENSHOT=path.png to also save a full-page
screenshot after the finished run (SPECVIZ_SCREENSHOT_DARK=path.png for the dark theme)."""

import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
ROOT = Path(__file__).resolve().parent.parent
STARTUP_SECONDS = 180
RUN_SECONDS = 600                      # a slow shared CPU decodes a few tokens per second
LONG_PROMPT = "Write a long, detailed essay about the history of the city of Rome, in many paragraphs."
PROMPT = ('Correct the spelling in this sentence and return it: "The quick brown fox jumpd over the '
          'lazy dog, and the dog did not wake up."')

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def app_url(tmp_path_factory):
    port = free_port()
    log_path = tmp_path_factory.mktemp("app") / "app.log"
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", SPECVIZ_HOSTED="0")
    env.pop("SPACE_ID", None)
    # On a shared machine, torch's threads spin against other processes for the same cores (a
    # step took 10x longer with two threads than with one on a busy 2-core machine).
    env.setdefault("OMP_NUM_THREADS", "1")
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + STARTUP_SECONDS
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"app.py exited with {process.returncode}:\n{log_path.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"app.py did not answer within {STARTUP_SECONDS} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
        log_text = log_path.read_text()
        assert "run failed" not in log_text, log_text[-3000:]  # the handler logs unexpected errors so


@pytest.fixture(scope="module")
def browser():
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield browser
        browser.close()


def set_max_new_tokens(page, value: int) -> None:
    box = page.locator("#max-new-tokens input[type=number]")
    box.fill(str(value))
    box.press("Enter")
    box.blur()


def stats_text(page) -> str:
    return page.locator("#stats").inner_text()


def wait_for_stats(page, pattern: str, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        text = stats_text(page)
        if re.search(pattern, text):
            return text
        page.wait_for_timeout(500)
    pytest.fail(f"#stats never matched {pattern!r}; it says:\n{stats_text(page)}")


def test_run_then_stop(app_url, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app_url)
    page.locator("#prompt textarea").wait_for(timeout=60_000)

    # A finished run: coloured tokens, four charts, a summary.
    page.locator("#prompt textarea").fill(PROMPT)
    set_max_new_tokens(page, 48)
    page.locator("#run").click()
    summary = wait_for_stats(page, r"Finished|could not go ahead", RUN_SECONDS)
    assert "could not go ahead" not in summary, summary
    assert "acceptance" in summary.lower() and "speedup" in summary.lower()
    verdicts = page.locator("#tokens [data-verdict]").evaluate_all("els => els.map(e => e.dataset.verdict)")
    assert verdicts and set(verdicts) <= {"accepted", "rejected", "resampled", "bonus"}
    assert page.locator("#tokens [data-verdict]").first.get_attribute("title")
    assert page.locator("#charts .js-plotly-plot").count() == 4
    assert "done" in page.locator("#baseline").inner_text()
    print(summary)

    if os.environ.get("SPECVIZ_SCREENSHOT"):
        page.screenshot(path=os.environ["SPECVIZ_SCREENSHOT"], full_page=True)
    if os.environ.get("SPECVIZ_SCREENSHOT_DARK"):
        page.locator("#dark-toggle").click()
        page.wait_for_timeout(1000)
        page.screenshot(path=os.environ["SPECVIZ_SCREENSHOT_DARK"], full_page=True)
        page.locator("#dark-toggle").click()

    # A longer run, stopped once it is going: the numbers freeze and the page stays usable.
    page.locator("#prompt textarea").fill(LONG_PROMPT)
    set_max_new_tokens(page, 512)
    page.locator("#run").click()
    wait_for_stats(page, r"Running", RUN_SECONDS)
    page.locator("#stop").click()
    wait_for_stats(page, r"Stopped", 30)
    tokens_at_stop = page.locator("#tokens [data-verdict]").count()
    page.wait_for_timeout(4000)
    assert page.locator("#tokens [data-verdict]").count() <= tokens_at_stop + 16  # at most one more cycle landed
    assert "done" not in page.locator("#baseline").inner_text()
    assert "Stopped" in stats_text(page)

    # A model that does not exist: a message in the page, no stack trace, and the app still works.
    target = page.locator("#target input, #target textarea").first
    target.fill("no-such-org/no-such-model")
    page.locator("#run").click()
    error = wait_for_stats(page, r"could not go ahead", 120)
    assert "no-such-model" in error and "Traceback" not in error

    target.fill("")   # blank: the built-in default
    set_max_new_tokens(page, 16)
    page.locator("#run").click()
    wait_for_stats(page, r"Finished", RUN_SECONDS)
    assert page.locator("#tokens [data-verdict]").count() > 0
    page.close()
