"""The README's screenshots, taken as a user would see the app: `python scripts/screenshots.py` serves
the whole app on the built-in model, drives it in headless Chromium (Run with the default example,
then Compare and its export, then Teach stepped to a sampled rejection, then Replay of the bundled
prompt-lookup recording at 4x) and saves assets/screenshot.png, compare.png, teach.png and replay.png
(and /tmp/explain.png)."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz.ui import build_demo, configure_torch, launch_options  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def text_matches(page, selector: str, pattern: str, timeout_s: float) -> None:
    page.wait_for_function("([selector, pattern]) => new RegExp(pattern).test("
                           "document.querySelector(selector)?.innerText || '')",
                           arg=[selector, pattern], timeout=timeout_s * 1000, polling=250)


def screenshots(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#run")
        page.click("#run")
        text_matches(page, "#stats", "Finished|could not go ahead", 900)
        print("run:", page.inner_text("#stats").splitlines()[1])
        page.wait_for_function("document.querySelectorAll('#charts .js-plotly-plot').length === 4")
        page.screenshot(path=str(out / "screenshot.png"), full_page=True)

        page.get_by_role("tab", name="Compare").click()
        page.click("#cmp-run")
        text_matches(page, "#cmp-status", "won|came closest|could not", 900)
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
        page.wait_for_function("document.querySelectorAll('#replay-charts .js-plotly-plot').length === 4")
        print("replay:", page.inner_text("#replay-stats").splitlines()[1])
        page.screenshot(path=str(out / "replay.png"), full_page=True)
        browser.close()


if __name__ == "__main__":
    configure_torch()
    demo = build_demo(hosted=False)
    port = int(os.environ.get("GRADIO_SERVER_PORT", "7871"))
    demo.launch(server_port=port, prevent_thread_lock=True, **launch_options())
    try:
        screenshots(f"http://127.0.0.1:{port}/", ROOT / "assets")
    finally:
        demo.close()
