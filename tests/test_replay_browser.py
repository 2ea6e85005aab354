"""The Replay tab in headless Chromium, on a hosted-mode server (no model loads for a replay): a
bundled recording plays to its end through the Run tab's views, and a bad upload is a message.
Set SPECVIZ_REPLAY_SCREENSHOT=path.png to save a screenshot of the finished replay."""

import os
from pathlib import Path

import pytest
from conftest import CHROMIUM, running_app
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


def test_a_bundled_recording_replays_in_hosted_mode(tmp_path):
    from playwright.sync_api import sync_playwright

    with running_app(tiny=True) as app, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(app.url)
        page.get_by_role("tab", name="Replay").click()
        page.locator("#replay-speed").get_by_text("4\u00d7").click()
        page.locator("#replay-play").click()
        page.wait_for_function("document.querySelector('#replay-stats').innerText.includes('Replayed')",
                               timeout=120_000, polling=250)
        stats = page.locator("#replay-stats").inner_text()
        assert "Measured speedup" in stats and "Traceback" not in stats
        assert page.locator("#replay-tokens [data-verdict]").count() > 10
        assert page.locator("#replay-charts .js-plotly-plot").count() == 5
        assert "done" in page.locator("#replay-baseline").inner_text()
        if os.environ.get("SPECVIZ_REPLAY_SCREENSHOT"):
            page.screenshot(path=os.environ["SPECVIZ_REPLAY_SCREENSHOT"], full_page=True)

        # Cycle by cycle: Next shows one cycle more.
        page.locator("#replay-speed").get_by_text("Cycle by cycle").click()
        page.locator("#replay-play").click()
        page.wait_for_function("document.querySelector('#replay-stats').innerText.includes('Cycle 1')",
                               timeout=30_000, polling=250)
        page.locator("#replay-next").click()
        page.wait_for_function("document.querySelector('#replay-stats').innerText.includes('Cycle 2 of')",
                               timeout=30_000, polling=250)

        bad = tmp_path / "bad.json"
        bad.write_text('{"format": "something else"}')
        page.locator("#replay-upload input[type=file]").set_input_files(str(bad))
        page.wait_for_function("document.querySelector('#replay-info').innerText.includes('not a specviz')",
                               timeout=30_000, polling=250)
        browser.close()

