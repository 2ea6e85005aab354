"""The screenshots of the README and docs/app.md, taken as a user would see the app:
`python scripts/screenshots.py` serves the whole app on the built-in model and drives it in headless Chromium:

- the first screen after Run with the default example at three sizes: assets/laptop.png (1366x768, and its
  timeline chart alone: assets/timeline.png),
  projector.png (1280x720, Large text, dark mode) and phone.png (390x844), printing for each the page
  height and the y of the first token (issue 18's before/after figures);
- then, at 1366x768, the whole page (screenshot.png), Compare and its export (compare.png), Teach
  stepped to a sampled rejection (teach.png), Replay of the bundled prompt-lookup recording at 4x
  (replay.png), and /tmp/explain.png.

`python scripts/screenshots.py sizes` takes the three first screens only."""

import json
import os
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.ui import build_demo, configure_torch, launch_options  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


@contextmanager
def serving_app(default_port: int):
    """The whole app on the built-in model, as `python app.py` serves it (GRADIO_SERVER_PORT, else
    `default_port`), for the screenshot scripts: yields its URL and closes it on leaving."""
    configure_torch()
    demo = build_demo(hosted=False)
    port = int(os.environ.get("GRADIO_SERVER_PORT", str(default_port)))
    demo.launch(server_port=port, prevent_thread_lock=True, **launch_options())
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def text_matches(page, selector: str, pattern: str, timeout_s: float) -> None:
    page.wait_for_function("([selector, pattern]) => new RegExp(pattern).test("
                           "document.querySelector(selector)?.innerText || '')",
                           arg=[selector, pattern], timeout=timeout_s * 1000, polling=250)


# name, viewport, Large text, dark mode
SIZES = [("laptop", 1366, 768, False, False), ("projector", 1280, 720, True, True), ("phone", 390, 844, False, False)]
PAGE_Y = "(s) => { const r = document.querySelector(s).getBoundingClientRect(); return Math.round(r.top + scrollY); }"


def first_screens(browser, url: str, out: Path) -> None:
    """Each size's first screen once the default example's run has finished, and its layout figures."""
    for name, width, height, large, dark in SIZES:
        page = browser.new_page(viewport={"width": width, "height": height})
        page.goto(url)
        page.wait_for_function("document.querySelectorAll('#charts .js-plotly-plot').length === 5")
        if large:
            page.locator("#large-text input").check()
            page.wait_for_function("document.body.classList.contains('sv-large')")
        if dark:
            page.locator("#dark-toggle").click()
            page.wait_for_function("document.body.classList.contains('dark')")
        page.wait_for_timeout(500)         # Large text's resize event, plotly's redraw
        figures = dict(page_height_before_run=page.evaluate("document.documentElement.scrollHeight"),
                       run_button_y=page.evaluate(PAGE_Y, "#run"),
                       token_box_y=page.evaluate(PAGE_Y, "#tokens .sv-text"))
        page.click("#run")
        page.wait_for_selector("#tokens [data-verdict]", timeout=900_000)
        # The first token's place in the page when it appears (the first update may bring several cycles,
        # and the box keeps its newest line in view: then the first token is already scrolled up inside it).
        figures["first_token_y"] = page.evaluate(PAGE_Y, "#tokens [data-verdict]")
        text_matches(page, "#stats", "Finished|could not go ahead", 900)
        page.wait_for_timeout(1500)        # the last chart update
        figures.update(page_height_after_run=page.evaluate("document.documentElement.scrollHeight"),
                       speedup_bottom=round(page.evaluate(
                           "document.querySelector('#stats .sv-tile-speedup').getBoundingClientRect().bottom")),
                       horizontal_overflow=page.evaluate("document.documentElement.scrollWidth - innerWidth"))
        if name == "laptop":     # the timeline chart (where the time goes), under the other four
            page.locator("#chart-timeline").screenshot(path=str(out / "timeline.png"))
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(out / f"{name}.png"))
        print(f"{name} {width}x{height}:", json.dumps(figures), "|", page.locator("#stats .sv-headline").inner_text())
        page.close()


def screenshots(url: str, out: Path, sizes_only: bool = False) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        first_screens(browser, url, out)
        if sizes_only:
            browser.close()
            return
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        page.goto(url)
        page.wait_for_selector("#run")
        page.click("#run")
        text_matches(page, "#stats", "Finished|could not go ahead", 900)
        print("run:", page.inner_text("#stats .sv-headline"))
        page.wait_for_function("document.querySelectorAll('#charts .js-plotly-plot').length === 5")
        page.screenshot(path=str(out / "screenshot.png"), full_page=True)

        page.get_by_role("tab", name="Compare").click()
        page.click("#cmp-run")
        text_matches(page, "#cmp-status", "over plain decoding|could not", 900)
        print("compare:", page.inner_text("#cmp-status"))
        page.click("#cmp-export")
        text_matches(page, "#cmp-files", "summary", 120)
        print("exported:", page.inner_text("#cmp-files").replace("\n", " "))
        page.screenshot(path=str(out / "compare.png"), full_page=True)

        page.get_by_role("tab", name="Teach").click()
        page.click("#teach-run")
        text_matches(page, "#teach-position", "Cycle 1 of", 600)
        # Step to a cycle with accepted drafts and a sampled rejection, to show the residual.
        for _ in range(40):
            if ("drawn from the residual" in page.inner_text("#teach-narrative")
                    and page.locator("#teach-table [data-verdict=accepted]").count()):
                break
            before = page.inner_text("#teach-position")
            page.click("#teach-next")
            page.wait_for_function(f"() => document.querySelector('#teach-position')?.innerText !== {before!r}",
                                   timeout=20_000)
        page.screenshot(path=str(out / "teach.png"), full_page=True)
        print("teach:", page.inner_text("#teach-position"))

        page.get_by_role("tab", name="Explain").click()
        page.wait_for_selector("#explain-chart .js-plotly-plot")
        page.screenshot(path="/tmp/explain.png", full_page=True)

        page.get_by_role("tab", name="Replay").click()
        page.locator("#replay-speed").get_by_text("4\u00d7").click()
        page.click("#replay-play")
        text_matches(page, "#replay-stats", "Replayed|could not", 300)
        page.wait_for_function("document.querySelectorAll('#replay-charts .js-plotly-plot').length === 5")
        print("replay:", page.inner_text("#replay-stats .sv-headline"))
        page.screenshot(path=str(out / "replay.png"), full_page=True)
        browser.close()


if __name__ == "__main__":
    with serving_app(7871) as app_url:
        screenshots(app_url, ROOT / "assets", sizes_only=sys.argv[1:] == ["sizes"])
