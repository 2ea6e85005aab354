"""The Train tab's screenshots: `python scripts/train_screenshots.py` serves the app and drives it in
headless Chromium: the Train tab while it trains a head for the built-in SmolLM2-135M-Instruct on a
small budget (assets/train.png: 4,000 tokens and a few epochs, a couple of minutes rather than the
shipped head's hour), its Race button racing that fresh head in the Run tab, its vLLM button sweeping
the same folder on vLLM in the Load tab (method eagle3, batch sizes 1, 2, 4, k 0 and the head's;
assets/train_sweep.png; needs SPECVIZ_VLLM_PYTHON, skipped without it), then the Run tab racing the
shipped head against plain decoding (assets/head_race.png)."""

import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from screenshots import CHROMIUM_ARGS, serving_app, text_matches  # noqa: E402


# A chat prompt the shipped head never saw: the example prompts are kept out of its training files
# (tests/test_head.py checks), and the refrigerator prompt used before is near one of them now.
PROMPT = "Give me five simple tips for sleeping better."


def main() -> int:
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp()) / "tiny-head"
    with serving_app(7893) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 900})
        page.goto(url)
        page.get_by_role("tab", name="Train").click()
        page.locator("#train-out textarea, #train-out input").first.fill(str(folder))
        for name, value in (("tokens", 4000), ("minutes", 6), ("epochs", 8)):
            box = page.locator(f"#train-{name} input[type=number]")
            box.fill(str(value))
            box.press("Enter")
        page.click("#train")
        text_matches(page, "#train-status", r"epoch [4-9]\d*/", 900)   # a few epochs drawn, still training
        page.wait_for_timeout(1500)
        page.screenshot(path=str(ROOT / "assets" / "train.png"), full_page=True)
        text_matches(page, "#train-status", "Done", 900)
        page.click("#train-race")                      # the fresh head races in the Run tab
        text_matches(page, "#stats", "Finished|could not go ahead", 900)
        if os.environ.get("SPECVIZ_VLLM_PYTHON"):      # the same folder on vLLM, from the Train tab's second button
            page.get_by_role("tab", name="Train").click()
            page.click("#train-sweep")
            text_matches(page, "#load-status", "Finished|Stopped|could not", 1500)
            page.wait_for_timeout(1500)
            print("sweep:", page.locator("#load-status").inner_text(), "|", page.locator("#load-decision").inner_text())
            page.screenshot(path=str(ROOT / "assets" / "train_sweep.png"), full_page=True)
            page.get_by_role("tab", name="Run").click()
        page.locator("#settings").first.click()
        page.get_by_label("Draft model", exact=True).first.check()
        page.locator("#draft-model textarea, #draft-model input").first.fill("head")
        page.locator("#k input[type=number]").first.fill("2")
        page.locator("#max-new-tokens input[type=number]").first.fill("64")
        page.locator("#prompt textarea").fill(PROMPT)
        page.locator("#settings > button").first.click()          # close the panel: the race in view
        page.click("#run")
        page.wait_for_timeout(1000)
        page.wait_for_function("() => { const t = document.querySelector('#stats').textContent; "
                               "return !/Running/.test(t) && /Finished|could not go ahead/.test(t); }",
                               timeout=900_000, polling=250)
        page.wait_for_timeout(2000)
        page.evaluate("window.scrollTo(0, 0)")
        page.screenshot(path=str(ROOT / "assets" / "head_race.png"), full_page=False)
        browser.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
