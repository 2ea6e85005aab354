"""A bf16 race whose greedy output parts from plain decoding's at a near-tie, as the app shows it: the
summary says where the outputs part and that the speedup compares the same text (plain decoding stepped
along the speculative text after the race, `core.plain.follow`). The app's Run tab decodes in the
dtype 'auto' picks (float32 on a CPU, where outputs do not part), so the race is recorded on the command
line in bfloat16 and replayed in the Replay tab at 1366x768 in headless Chromium: assets/parted_bf16.png.

    python scripts/parted_screenshot.py"""

import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import CHROMIUM_ARGS, ROOT, serving_app, text_matches  # noqa: E402

PROMPT = "Why is the sky blue? Explain it to a ten-year-old."     # the bundled prompt chat-sky


def main() -> None:
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        recording = Path(folder) / "parted.json"
        subprocess.run([sys.executable, "-m", "specviz", "run", "--dtype", "bfloat16", "--baseline", "--k", "8",
                        "--max-new-tokens", "96", "--record", str(recording), PROMPT], check=True, cwd=ROOT,
                       stdout=subprocess.DEVNULL)
        with serving_app(7874) as url, sync_playwright() as p:
            browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1366, "height": 768})
            page.goto(url)
            page.wait_for_selector("#run")
            page.get_by_role("tab", name="Replay").click()
            page.set_input_files("#replay-upload input[type=file]", str(recording))
            text_matches(page, "#replay-info", "ngram", 60)
            page.locator("#replay-speed").get_by_text("4\u00d7").click()
            page.click("#replay-play")
            text_matches(page, "#replay-stats", "Replayed|could not", 300)
            page.wait_for_timeout(1500)
            print(page.inner_text("#replay-stats .sv-parted"))
            print(page.inner_text("#replay-stats .sv-headline"))
            page.locator("#replay-stats").screenshot(path=str(ROOT / "assets" / "parted_bf16.png"))
            browser.close()


if __name__ == "__main__":
    main()
