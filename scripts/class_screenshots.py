"""The two screenshots of docs/spaces.md's "A class at once", at 1366x768 in headless Chromium, on the
built-in model with one race at a time (SPECVIZ_RACES=1, so that a second visitor waits):

- assets/class_waiting.png: a visitor who pressed Run while another's race runs: their place in line,
  the estimated wait, and the example's bundled recording playing, marked as a recording;
- assets/class_shared.png: a visitor who asked for the race the first one is watching: the shared
  race, labelled with when it was measured and how many it was shown to.

    python scripts/class_screenshots.py"""

import os
import sys
from pathlib import Path

os.environ["SPECVIZ_RACES"] = "1"
sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import CHROMIUM_ARGS, ROOT, serving_app, text_matches  # noqa: E402

OWN = "Explain in two sentences why the sky is blue."


def open_page(browser, url: str):
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    page.goto(url)
    page.wait_for_selector("#run")
    return page


def main() -> None:
    from playwright.sync_api import sync_playwright

    out = ROOT / "assets"
    with serving_app(7871) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        first = open_page(browser, url)               # a race of one's own holds the only slot
        first.fill("#prompt textarea", OWN)
        first.click("#run")
        text_matches(first, "#stats", "Running|Measured", 300)
        waiting = open_page(browser, url)             # the default example: waits, its recording plays
        waiting.click("#run")
        text_matches(waiting, "#stats", "Recording, while you wait", 60)
        waiting.wait_for_timeout(3000)
        waiting.screenshot(path=str(out / "class_waiting.png"))
        print("wrote", out / "class_waiting.png")
        joined = open_page(browser, url)              # the same race, asked for again while it waits or runs
        joined.click("#run")
        text_matches(joined, "#stats", "Finished", 300)
        text_matches(joined, "#stats", "shown to 2 people", 30)
        joined.locator("#stats .sv-state").scroll_into_view_if_needed()     # the label, under the headline
        joined.wait_for_timeout(1500)
        joined.screenshot(path=str(out / "class_shared.png"))
        print("wrote", out / "class_shared.png")
        browser.close()


if __name__ == "__main__":
    main()
