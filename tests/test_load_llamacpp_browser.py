"""The Load tab on llama.cpp in headless Chromium, against `python app.py`: the engine choice, a sweep
whose points and llama.cpp's acceptance chart appear, the llama-server flags to copy, and Stop ending
the sweep and its server (no llama.cpp server outlives it). SPECVIZ_LOAD_LLAMACPP_SCREENSHOT=path.png
saves the page (1366x768) before Stop."""

import os

import pytest
from conftest import CHROMIUM, running_app
from test_engine_llamacpp import servers, wait_gone, xllamacpp_missing


pytestmark = [
    pytest.mark.slow,
    xllamacpp_missing,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


@pytest.fixture(scope="module")
def app_url():
    with running_app(SPECVIZ_LLAMACPP_THREADS="1") as app:     # see test_engine_llamacpp.ONE_THREAD
        yield app.url


def test_a_sweep_on_llamacpp_in_the_load_tab_and_stop_ends_its_server(app_url, browser):
    before = servers()
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    page.goto(app_url)
    page.get_by_role("tab", name="Load").click()
    page.locator("#load-settings").get_by_text("Settings").first.click()
    page.locator("#load-engine").get_by_text("llama.cpp (the server on your machine)", exact=True).click()
    # CI measures batch 1 and stops during batch 2 (batch 4 took another 80 s of the suite here); the
    # screenshot waits for batch 4 (batches 1 and 2 drawn). The plain server measures every batch size
    # first, then the speculative one.
    screenshot = os.environ.get("SPECVIZ_LOAD_LLAMACPP_SCREENSHOT")
    batches, waiting_for = ("1,2,4", 4) if screenshot else ("1,2", 2)
    page.locator("#load-batches textarea, #load-batches input").first.fill(batches)
    page.locator("#load-ks textarea, #load-ks input").first.fill("0,4")
    page.locator("#load-settings").get_by_text("Settings").first.click()     # close the panel
    page.locator("#load-run").click()
    # the speculative server's batch sizes before the last one are measured: llama.cpp's acceptance chart
    page.wait_for_function(f"/ngram-simple k=4: batch {waiting_for}/.test(document.querySelector('#load-status')"
                           ".textContent)", timeout=300_000, polling=500)
    assert page.locator("#load-rows [data-engine=llamacpp]").count() == 1
    assert "llama.cpp returns no rejected drafts" in page.locator("#load-rows").inner_text()
    copy = page.locator("#load-vllm-config").inner_text()
    assert "--spec-type ngram-simple" in copy or "null" in copy, copy
    assert page.locator("#load-chart-acceptance .barlayer .trace").count() >= waiting_for // 2   # k = 4's batches
    decision = page.locator("#load-decision").inner_text()
    assert "speculate up to batch" in decision or "does not pay here" in decision, decision
    running = servers() - before
    assert len(running) == 1                        # one server at a time
    if screenshot:
        page.screenshot(path=screenshot, full_page=True)
    page.locator("#load-stop").click()
    page.wait_for_function("/Stopped/.test(document.querySelector('#load-status').textContent)",
                           timeout=60_000, polling=500)
    assert wait_gone(running, 20), "the llama.cpp server outlived Stop"
    page.close()
