"""The presenter view in headless Chromium at 1280x720 (a projector), on a hosted-mode tiny server:
the toggle hides the settings, the token panes and the speedup grow, and after a run both panes and
the speedup sit inside the first screen; toggled off, the page is as it was. Set
SPECVIZ_PRESENTER_SCREENSHOT=path.png to save the screenshot (docs/app.md's is of the built-in model:
`running_app()` without tiny)."""

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

SIZES = """() => {
  const px = (el) => parseFloat(getComputedStyle(el).fontSize);
  const text = document.querySelector('#tokens .sv-text');
  return {text_height: text.getBoundingClientRect().height, text_font: px(text),
          settings: document.querySelector('#settings').offsetParent !== null};
}"""


def test_presenter_view_fits_a_projector():
    from playwright.sync_api import sync_playwright

    tiny = not os.environ.get("SPECVIZ_PRESENTER_BUILT_IN")
    with running_app(tiny=tiny, seconds=600) as app, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(app.url)
        page.locator("#tokens .sv-text").wait_for(timeout=60_000)
        before = page.evaluate(SIZES)
        assert before["settings"]
        page.locator("#presenter").click()
        page.wait_for_function("document.body.classList.contains('sv-presenter')")
        after = page.evaluate(SIZES)
        assert not after["settings"]
        assert after["text_height"] > 1.1 * before["text_height"] and after["text_font"] > 1.2 * before["text_font"]

        page.locator("#run").click()
        page.wait_for_function("document.querySelector('#stats').innerText.includes('Finished')",
                               timeout=600_000, polling=250)
        for selector in ("#tokens .sv-text", "#baseline .sv-text", ".sv-tile-speedup .sv-tile-value"):
            box = page.locator(selector).first.bounding_box()
            assert box["y"] >= 0 and box["y"] + box["height"] <= 720, (selector, box)
        speedup = page.locator(".sv-tile-speedup .sv-tile-value").first
        assert speedup.evaluate("el => parseFloat(getComputedStyle(el).fontSize)") >= 48
        if os.environ.get("SPECVIZ_PRESENTER_SCREENSHOT"):
            page.screenshot(path=os.environ["SPECVIZ_PRESENTER_SCREENSHOT"])

        page.locator("#presenter").click()
        page.wait_for_function("!document.body.classList.contains('sv-presenter')")
        assert page.evaluate(SIZES) == before
        browser.close()
