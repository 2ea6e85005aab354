"""The Compare, Teach and Explain tabs on their own page, on the built-in model: `python
scripts/tabs_demo.py` serves them; `python scripts/tabs_demo.py --screenshots` also drives them in
headless Chromium and saves assets/compare.png and assets/teach.png (and /tmp/explain.png)."""

import argparse
import os
import sys
from pathlib import Path

import gradio as gr

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specviz import tabs, ui  # noqa: E402

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync"]


def build() -> gr.Blocks:
    with gr.Blocks(title="specviz: compare, teach, explain") as demo:
        last_run = gr.State(None)
        with gr.Tabs():
            with gr.Tab("Compare"):
                tabs.build_compare_tab(hosted=False, last_run=last_run)
            with gr.Tab("Teach"):
                tabs.build_teach_tab(hosted=False, last_run=last_run)
            with gr.Tab("Explain"):
                tabs.build_explain_tab(last_run=last_run)
    demo.queue()
    return demo


def screenshots(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.wait_for_selector("#cmp-run")
        page.click("#cmp-run")
        page.wait_for_function("() => /won|came closest|could not/"
                               ".test(document.querySelector('#cmp-status')?.innerText || '')", timeout=900_000)
        print("compare:", page.inner_text("#cmp-status"))
        page.click("#cmp-export")
        page.wait_for_function("() => /summary/.test(document.querySelector('#cmp-files')?.innerText || '')",
                               timeout=120_000)
        print("exported:", page.inner_text("#cmp-files").replace("\n", " "))
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "compare.png"), full_page=True)

        page.get_by_role("tab", name="Teach").click()
        page.click("#teach-run")
        page.wait_for_function("() => /Cycle 1 of/.test(document.querySelector('#teach-position')?.innerText || '')",
                               timeout=600_000)
        # Step to a cycle with accepted drafts and a sampled rejection, to show the residual.
        for _ in range(40):
            if ("drawn from the residual" in page.inner_text("#teach-narrative")
                    and page.locator("#teach-table [data-verdict=accepted]").count()):
                break
            before = page.inner_text("#teach-position")
            page.click("#teach-next")
            page.wait_for_function(f"() => document.querySelector('#teach-position')?.innerText !== {before!r}",
                                   timeout=20_000)
        page.wait_for_timeout(1500)
        page.screenshot(path=str(out / "teach.png"), full_page=True)
        print("teach:", page.inner_text("#teach-position"))

        page.get_by_role("tab", name="Explain").click()
        page.wait_for_timeout(2000)
        page.screenshot(path="/tmp/explain.png", full_page=True)
        browser.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--screenshots", action="store_true")
    args = parser.parse_args()
    demo = build()
    if not args.screenshots:
        demo.launch(**ui.launch_options())
    else:
        port = int(os.environ.get("GRADIO_SERVER_PORT", "7871"))
        demo.launch(server_port=port, prevent_thread_lock=True, **ui.launch_options())
        try:
            screenshots(f"http://127.0.0.1:{port}/", ROOT / "assets")
        finally:
            demo.close()
