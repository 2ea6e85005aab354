"""Keys in headless Chromium at 1280x720, on a hosted-mode server with the slow tiny target (a run
lasts seconds): space runs and stops in the Run tab, runs Teach and steps it with the arrows, plays
Replay's cycle-by-cycle mode and steps it; nothing happens while the focus is in a text box."""

from pathlib import Path

import pytest
from conftest import CHROMIUM, running_app

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


def wait_text(page, selector: str, text: str, seconds: float = 60) -> None:
    page.wait_for_function("([s, t]) => document.querySelector(s).innerText.includes(t)", arg=[selector, text],
                           timeout=seconds * 1000, polling=100)


def press(page, key: str) -> None:
    """`key` with the focus on no control (the page's keys note, plain text)."""
    page.locator("#sv-keys").click()
    page.keyboard.press(key)


def test_space_and_the_arrows_drive_the_tabs_but_not_a_text_box():
    from playwright.sync_api import sync_playwright

    with running_app("slow", tiny=True) as app, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 720})
        page.goto(app.url)
        assert "space" in page.locator("#sv-keys").inner_text()

        # Typing a space in the prompt types a space; nothing runs.
        prompt = page.locator("#prompt textarea")
        before = prompt.input_value()
        prompt.click()
        prompt.press("Control+End")
        prompt.press(" ")
        page.wait_for_timeout(1500)
        assert prompt.input_value() == before + " "
        assert "Press Run" in page.locator("#stats").inner_text()

        # Run tab: space runs, space again (while it runs) stops.
        press(page, " ")
        wait_text(page, "#stats", "Running")
        press(page, " ")
        wait_text(page, "#stats", "Stopped.")

        # Teach: space decodes, then the arrows step.
        page.get_by_role("tab", name="Teach").click()
        page.locator("#teach-settings > button").first.click()     # the tiny target has no layer 24 to exit at
        page.locator("#teach-drafter").get_by_text("Prompt lookup (n-gram)").click()
        press(page, " ")
        wait_text(page, "#teach-position", "Cycle 1 of", 120)
        press(page, "ArrowRight")
        wait_text(page, "#teach-position", "Cycle 2 of")
        press(page, "ArrowLeft")
        wait_text(page, "#teach-position", "Cycle 1 of")

        # Replay: the arrows step only cycle by cycle; space plays.
        page.get_by_role("tab", name="Replay").click()
        page.locator("#replay-speed").get_by_text("Cycle by cycle").click()
        press(page, "ArrowRight")          # nothing played yet: Next steps from the start
        wait_text(page, "#replay-stats", "Cycle 1 of")
        press(page, "ArrowRight")
        wait_text(page, "#replay-stats", "Cycle 2 of")
        press(page, "ArrowLeft")
        wait_text(page, "#replay-stats", "Cycle 1 of")
        page.locator("#replay-speed").get_by_text("4\u00d7").click()
        press(page, " ")
        wait_text(page, "#replay-stats", "Replayed", 120)
        press(page, "ArrowLeft")           # not cycle by cycle: the arrows do nothing
        page.wait_for_timeout(1000)
        assert "Replayed" in page.locator("#replay-stats").inner_text()
        browser.close()
