"""assets/load_engines.png: the Load tab's "All three" on the built-in model, as a user would run it:
serves the whole app (vLLM from SPECVIZ_VLLM_PYTHON, llama.cpp from xllamacpp), chooses all three engines,
prompt lookup, batch 1, k 0 and 4, the rewrite set, presses Run in headless Chromium at 1366x768 and
waits for the three side by side (about 5 minutes on 2 cores: two vLLM servers start); then the same
page at 390x844 to /tmp/load_engines_phone.png (is the table readable on a phone?). Prints the table.

    SPECVIZ_VLLM_PYTHON=~/.cache/specviz-vllm-venv/bin/python HF_HUB_OFFLINE=1 python scripts/engines_screenshot.py
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from screenshots import CHROMIUM_ARGS, serving_app, text_matches  # noqa: E402

from specviz.ui.load_tab import ALL  # noqa: E402


def main(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        page.goto(url)
        page.get_by_role("tab", name="Load").click()
        page.locator("#load-settings").get_by_text("Settings").first.click()
        page.locator("#load-engine").get_by_text(ALL, exact=True).click()
        page.locator("#load-batches textarea, #load-batches input").first.fill("1")
        page.locator("#load-ks textarea, #load-ks input").first.fill("0,4")
        page.locator("#load-settings").get_by_text("Settings").first.click()     # close the panel
        page.locator("#load-run").click()
        text_matches(page, "#load-status", "Finished: three engines|Stopped|could not", 1500)
        page.wait_for_timeout(1500)                                               # the charts' last draw
        print(page.locator("#load-status").inner_text())
        print(page.locator("#load-rows").inner_text())
        print(page.locator("#load-decision").inner_text())
        page.screenshot(path=str(out / "load_engines.png"), full_page=True)
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(1000)
        print("phone: horizontal overflow of the page",
              page.evaluate("document.documentElement.scrollWidth - innerWidth"), "px")
        page.locator("#load-rows").screenshot(path="/tmp/load_engines_phone.png")
        browser.close()


if __name__ == "__main__":
    with serving_app(7873) as app_url:
        main(app_url, ROOT / "assets")
