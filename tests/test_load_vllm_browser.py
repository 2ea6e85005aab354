"""The Load tab on vLLM in headless Chromium, against `python app.py` on the built-in model: the
engine choice, a sweep whose points and vLLM's acceptance chart appear, the config to copy, and Stop
ending the sweep and its vLLM server (no vLLM process outlives it). Needs vLLM's environment (see
tests/test_engine_vllm.py); SPECVIZ_LOAD_VLLM_SCREENSHOT=path.png saves the page before Stop."""

import os
import time
from pathlib import Path

import pytest
from conftest import CHROMIUM, running_app
from test_engine_vllm import _vllm_python


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


def api_servers() -> list[int]:
    """The pids of vLLM API servers running now."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[1:3] == [b"-m", b"vllm.entrypoints.openai.api_server"]:
            out.append(int(pid))
    return out


@pytest.fixture(scope="module")
def vllm_app_url():
    with running_app(SPECVIZ_VLLM_PYTHON=_vllm_python(), VLLM_CPU_KVCACHE_SPACE="1") as app:
        yield app.url


def test_a_sweep_on_vllm_in_the_load_tab_and_stop_ends_its_servers(vllm_app_url, browser):
    before = set(api_servers())
    page = browser.new_page(viewport={"width": 1366, "height": 1000})
    page.goto(vllm_app_url)
    page.get_by_role("tab", name="Load").click()
    page.locator("#load-settings").get_by_text("Settings").first.click()
    page.locator("#load-engine").get_by_text("vLLM (the serving engine)", exact=True).click()
    # The plain server measures every batch size first, then the speculative one; the test stops it while it
    # measures batch 4, once batches 1 and 2 are drawn. It waits for what stays on the page (k = 4's bars in
    # vLLM's acceptance chart), not for the status line of batch 2 in progress: that line lasts only while
    # batch 2's few requests run, and a page busy beside CI's other worker could apply those updates between
    # two polls and go on to "Finished.", leaving the wait to run out with the sweep long done.
    screenshot = os.environ.get("SPECVIZ_LOAD_VLLM_SCREENSHOT")
    page.locator("#load-batches textarea, #load-batches input").first.fill("1,2,4")
    page.locator("#load-ks textarea, #load-ks input").first.fill("0,4")
    page.locator("#load-settings").get_by_text("Settings").first.click()     # close the panel
    page.locator("#load-run").click()
    waiting_for = 2         # k = 4's points at batches 1 and 2 drawn: the speculative server is on batch 4
    page.wait_for_function(f"document.querySelectorAll('#load-chart-acceptance .barlayer .trace').length >= "
                           f"{waiting_for}", timeout=420_000, polling=1000)
    assert "Finished" not in page.locator("#load-status").inner_text()
    assert page.locator("#load-rows [data-engine=vllm]").count() == 1
    assert "no rejected drafts" in page.locator("#load-rows").inner_text()
    assert '"method": "ngram"' in page.locator("#load-vllm-config").inner_text() or \
        "null" in page.locator("#load-vllm-config").inner_text()
    assert page.locator("#load-chart-acceptance .js-plotly-plot").count() == 1
    assert page.locator("#load-chart-acceptance .barlayer .trace").count() >= waiting_for     # k = 4's batches
    decision = page.locator("#load-decision").inner_text()
    assert "speculate up to batch" in decision or "does not pay here" in decision, decision
    running = set(api_servers()) - before
    assert len(running) == 1                       # one server at a time: the speculative one, the plain one stopped
    if screenshot:
        page.screenshot(path=screenshot, full_page=True)
    page.locator("#load-stop").click()
    page.wait_for_function("/Stopped/.test(document.querySelector('#load-status').textContent)",
                           timeout=60_000, polling=500)
    deadline = time.monotonic() + 30
    while set(api_servers()) & running and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not set(api_servers()) & running, "the vLLM server outlived Stop"
    page.close()
