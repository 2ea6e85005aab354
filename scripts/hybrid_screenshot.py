"""The Run tab with the hybrid drafter (`auto`): which drafter wrote each drafted token, at 1366x768 in
headless Chromium, on the built-in model: assets/hybrid_run.png (the token view with its drafter marks
and legend), assets/hybrid_stats.png (the summary, with the pair's note: on a CPU the head drafts with int8
weights) and assets/hybrid_chart.png (the chart of which drafter each cycle chose). Then, in the Replay tab,
the bundled recording of `auto` in bf16 (assets/recordings/hybrid-bf16-notice.json, the notice example: in
bf16 a pass over a few more tokens costs little, and trees of two drafters' branches are drafted):
assets/hybrid_tree.png (the token view, c+h marks) and assets/hybrid_timeline.png (a lane per drafter).
The recording was made with `python -m specviz run --dtype bfloat16 --draft auto --baseline
--max-new-tokens 128 --record FILE "<the notice example>"`.

    python scripts/hybrid_screenshot.py [PROMPT]      # default: the page's default example"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import CHROMIUM_ARGS, ROOT, serving_app, text_matches  # noqa: E402

from specviz.ui.common import AUTO  # noqa: E402

TREE_RECORDING = "hybrid-bf16-notice.json"


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

        page.get_by_role("tab", name="Replay").click()
        page.set_input_files("#replay-upload input[type=file]", str(out / "recordings" / TREE_RECORDING))
        text_matches(page, "#replay-info", "auto", 60)
        page.locator("#replay-speed").get_by_text("4\u00d7").click()
        page.click("#replay-play")
        text_matches(page, "#replay-stats", "Replayed|could not", 300)
        page.wait_for_function("document.querySelectorAll('#replay-charts .js-plotly-plot').length === 5")
        print("replay:", page.inner_text("#replay-stats .sv-headline"), "- two-drafter trees:",
              page.locator("#replay-tokens .sv-by:not([data-drafter])").count())
        page.locator("#replay-tokens").scroll_into_view_if_needed()
        page.locator("#replay-tokens").screenshot(path=str(out / "hybrid_tree.png"))
        page.locator("#replay-chart-timeline").scroll_into_view_if_needed()
        page.locator("#replay-chart-timeline").screenshot(path=str(out / "hybrid_timeline.png"))
        browser.close()


if __name__ == "__main__":
    main()
