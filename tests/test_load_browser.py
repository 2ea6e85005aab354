"""The Load tab in headless Chromium, on the tiny in-process models (tests/serve_tiny.py, hosted, its
slower target): Run streams the batch's rows, then the charts and the decision sentence appear.
Set SPECVIZ_LOAD_SCREENSHOT=path.png to save a screenshot of the finished sweep."""

import os

import pytest
from conftest import CHROMIUM
from test_first_screen import app_url  # noqa: F401 - a fixture, used by name

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


def test_run_on_the_load_tab_draws_the_charts_and_states_the_decision(app_url, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.goto(app_url)
    page.get_by_role("tab", name="Load").click()
    page.locator("#load-run").wait_for(timeout=60_000)
    page.wait_for_function("document.querySelectorAll('#load-chart-speedup .js-plotly-plot').length === 1",
                           timeout=30_000)
    assert "Run to see" in page.locator("#load-chart-speedup").text_content()
    page.locator("#load-run").click()
    page.wait_for_selector("#load-rows [data-verdict]", timeout=60_000)      # the batch's rows stream
    page.wait_for_function("/Finished|could not/.test(document.querySelector('#load-status').textContent)",
                           timeout=240_000, polling=500)
    assert "Finished" in page.locator("#load-status").text_content()
    decision = page.locator("#load-decision").inner_text()
    assert "speculate up to batch" in decision or "does not pay here" in decision, decision
    assert page.locator("#load-chart-speedup .scatterlayer .trace").count() >= 2    # k = 2 and k = 4 at least
    assert "Run to see" not in page.locator("#load-chart-speedup").text_content()
    assert page.locator("#load-rows .sv-panel").count() == 4                      # the last batch: 4 requests
    if os.environ.get("SPECVIZ_LOAD_SCREENSHOT"):
        page.screenshot(path=os.environ["SPECVIZ_LOAD_SCREENSHOT"], full_page=True)
    page.close()


def test_stop_on_the_load_tab_ends_the_sweep(app_url, browser):  # noqa: F811
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.goto(app_url)
    page.get_by_role("tab", name="Load").click()
    page.locator("#load-run").wait_for(timeout=60_000)
    page.locator("#load-run").click()
    page.wait_for_selector("#load-rows [data-verdict]", timeout=60_000)
    page.locator("#load-stop").click()
    page.wait_for_function("/Stopped/.test(document.querySelector('#load-status').textContent)",
                           timeout=30_000, polling=250)
    page.wait_for_timeout(2_000)        # nothing more arrives: the sweep was closed
    assert "Stopped" in page.locator("#load-status").text_content()
    page.close()
