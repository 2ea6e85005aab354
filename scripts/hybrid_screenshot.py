"""The Run tab with the hybrid drafter (`auto`): which drafter wrote each drafted token, at 1366x768 in
headless Chromium, on the built-in model: assets/hybrid_run.png (the token view with its drafter marks
and legend), assets/hybrid_stats.png (the summary, with the pair's note: on a CPU the head drafts with int8
weights) and assets/hybrid_chart.png (the chart of which drafter each cycle chose).

    python scripts/hybrid_screenshot.py [PROMPT]      # default: the page's default example"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import CHROMIUM_ARGS, ROOT, serving_app, text_matches  # noqa: E402

from specviz.ui.common import AUTO  # noqa: E402


def main() -> None:
    from playwright.sync_api import sync_playwright

    out = ROOT / "assets"
    prompt = sys.argv[1] if len(sys.argv) > 1 else None
    with serving_app(7873) as url, sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1366, "height": 768})
        page.goto(url)
        page.wait_for_selector("#run")
        page.locator("#settings").get_by_text("Settings").first.click()
        page.locator("#drafter").get_by_role("radio", name=AUTO).check()
        if prompt:
            page.fill("#prompt textarea", prompt)
        page.click("#run")
        text_matches(page, "#stats", "Finished|could not go ahead", 900)
        page.wait_for_timeout(2500)        # the last chart update
        print("run:", page.inner_text("#stats .sv-headline"))
        print("drafter marks:", page.locator("#tokens .sv-by").count(), "legend:",
              page.locator("#tokens .sv-legend").inner_text().replace("\n", " "))
        page.locator("#tokens").scroll_into_view_if_needed()
        page.locator("#tokens").screenshot(path=str(out / "hybrid_run.png"))
        print("note:", page.locator("#stats .sv-pair-note").all_inner_texts())
        page.locator("#stats").screenshot(path=str(out / "hybrid_stats.png"))
        page.locator("#chart-per-pass").screenshot(path=str(out / "hybrid_chart.png"))
        browser.close()


if __name__ == "__main__":
    main()
