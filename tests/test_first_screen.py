"""The first screen is the demo (issue 18), held in headless Chromium at three sizes: a 1366x768
laptop, a 1280x720 projector with Large text and dark mode, a 390x844 phone. The app runs on the tiny
in-process models (tests/serve_tiny.py, its slower target so that a run streams for seconds): these
tests are about where things are on the page, not about the model."""

import re
from pathlib import Path

import pytest

from conftest import CHROMIUM, running_app

# A verdict and the live speedup are on screen this soon after Run. Alone, the tiny slow app shows its
# first verdict 2.5-6 s after Run on the 2-core machine (headless Chromium). Beside another worker's
# app, browser or engine server, all four tests here missed even 30 s in CI runs: so they are marked
# `alone` (the other xdist worker waits, tests/conftest.py), and each stops its run before it closes
# its page (a run left going holds the app's one-at-a-time queue, and the next test's Run waits for it).
STREAMING_SECONDS = 10

pytestmark = [
    pytest.mark.slow,
    pytest.mark.alone,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]

# Where an element is, in the viewport's pixels, and whether all of it is inside the first screen.
BOX = """(selector) => {
  const element = document.querySelector(selector);
  if (!element) return null;
  const r = element.getBoundingClientRect();
  return {top: r.top, bottom: r.bottom, left: r.left, right: r.right,
          inside: r.top >= 0 && r.bottom <= innerHeight && r.left >= 0 && r.right <= innerWidth && r.height > 0};
}"""


@pytest.fixture(scope="module")
def app_url():
    with running_app("slow", tiny=True) as app:
        yield app.url


def open_page(browser, url, width, height, *, large=False, dark=False, touch=False):
    page = browser.new_page(viewport={"width": width, "height": height}, has_touch=touch)
    page.goto(url)
    page.locator("#run").wait_for(timeout=60_000)
    page.locator("#tokens .sv-panel").wait_for(timeout=30_000)
    page.locator("#stats .sv-idle").wait_for(timeout=30_000)
    if large:
        page.locator("#large-text input").check()
        page.wait_for_function("document.body.classList.contains('sv-large')")
    if dark:
        page.locator("#dark-toggle").click()
        page.wait_for_function("document.body.classList.contains('dark')")
    page.evaluate("window.scrollTo(0, 0)")
    return page


FINISHED = "Finished|could not|Stopped"      # what #stats says when the run is over


def run_and_wait_for_a_verdict(page, seconds=STREAMING_SECONDS):
    page.locator("#run").click()
    page.wait_for_selector("#tokens [data-verdict]", timeout=seconds * 1000)
    page.wait_for_selector("#stats .sv-tile-speedup", timeout=seconds * 1000)


def stop_and_close(page) -> None:
    """Stop the page's run if it is still going (Stop ends it in the server), then close the page."""
    if not re.search(FINISHED, page.locator("#stats").text_content()):
        page.locator("#stop").click()
        page.wait_for_function(f"/{FINISHED}/.test(document.querySelector('#stats').textContent)",
                               timeout=60_000, polling=250)
    page.close()


def overflow(page) -> int:
    return page.evaluate("document.documentElement.scrollWidth - innerWidth")


def test_laptop_shows_the_race_and_the_speedup_without_scrolling(app_url, browser):
    page = open_page(browser, app_url, 1366, 768)
    assert not page.locator("#drafter").is_visible()             # the settings panel starts closed
    before = page.evaluate(BOX, "#tokens")
    # Before data the charts say what they will show (an empty state, not meaningless axes).
    page.wait_for_function("document.querySelectorAll('#charts .js-plotly-plot').length === 5", timeout=30_000)
    assert page.locator("#charts").text_content().count("Run to see") == 5
    assert page.locator("#charts .xtick").count() == 0
    run_and_wait_for_a_verdict(page)
    assert page.evaluate("scrollY") == 0
    token = page.evaluate(BOX, "#tokens [data-verdict]")
    speedup = page.evaluate(BOX, "#stats .sv-tile-speedup")
    assert token["inside"], token
    assert speedup["inside"], speedup
    assert page.evaluate(BOX, "#tokens")["top"] == before["top"]     # nothing appeared above the race
    page.wait_for_function("/Finished|could not/.test(document.querySelector('#stats').textContent)",
                           timeout=120_000, polling=250)
    assert page.evaluate(BOX, "#tokens")["top"] == before["top"]     # not even the recording's button
    assert page.locator("#record").is_enabled()
    # The token box scrolls inside, its newest token in sight; short text starts at its top.
    box = page.evaluate(BOX, "#tokens .sv-text")
    newest = page.locator("#tokens [data-verdict]").last.evaluate(
        "e => { const r = e.getBoundingClientRect(); return {top: r.top, bottom: r.bottom}; }")
    assert box["top"] - 1 <= newest["top"] and newest["bottom"] <= box["bottom"] + 1, (newest, box)
    summary = page.locator("#stats")
    assert "identical outputs" in summary.locator(".sv-headline").inner_text()
    assert not summary.locator("table").is_visible()             # the details wait behind their disclosure
    summary.locator("details > summary").click()
    assert summary.locator("table").is_visible() and "Per-token acceptance" in summary.inner_text()
    stop_and_close(page)


def test_phone_stacks_and_nothing_overflows(app_url, browser):
    page = open_page(browser, app_url, 390, 844, touch=True)
    assert overflow(page) <= 0
    assert page.evaluate(BOX, "#run")["inside"]
    tabs = page.get_by_role("tab")
    names = [tabs.nth(i).inner_text() for i in range(tabs.count())]
    teaching = ["Run", "Compare", "Load", "Teach", "Explain", "Replay"]
    # Train (local runs only, minutes of work: a desktop's tab) may sit behind the tab bar's overflow menu.
    assert names in (teaching, teaching + ["Train"])
    assert all(tabs.nth(i).is_visible() for i in range(tabs.count()))   # none hidden behind "..."
    # The title wraps between words only: each word of it on one line.
    words = page.evaluate("""() => {
      const h = document.querySelector('#sv-title h1'); const range = document.createRange();
      const text = h.firstChild; const out = []; let at = 0;
      for (const word of text.textContent.split(' ')) {
        range.setStart(text, at); range.setEnd(text, at + word.length); out.push(range.getClientRects().length);
        at += word.length + 1;
      }
      return out; }""")
    assert words and all(n == 1 for n in words), words
    run_and_wait_for_a_verdict(page)
    spec, plain = page.evaluate(BOX, "#tokens"), page.evaluate(BOX, "#baseline")
    assert plain["top"] >= spec["bottom"] - 1                    # the two views stack
    assert overflow(page) <= 0
    stop_and_close(page)


def test_projector_with_large_text_and_dark_mode_fits_tokens_and_headline(app_url, browser):
    page = open_page(browser, app_url, 1280, 720, large=True, dark=True)
    run_and_wait_for_a_verdict(page)
    assert page.evaluate("scrollY") == 0
    # where they were when not inside (it failed once in a loaded CI run here, and passed in every other)
    verdict, tile = page.evaluate(BOX, "#tokens [data-verdict]"), page.evaluate(BOX, "#stats .sv-tile-speedup")
    assert verdict["inside"], (verdict, page.evaluate(BOX, "#tokens"), page.evaluate("innerHeight"))
    assert tile["inside"], (tile, page.evaluate("innerHeight"))
    # Large text scales the legend too (the whole page is zoomed), and dark mode keeps unselected radio
    # buttons visible: their outline is light on the dark page.
    assert float(page.evaluate("getComputedStyle(document.querySelector('.gradio-container')).zoom")) > 1
    page.locator("#settings").get_by_text("Settings").first.click()
    radio = page.locator("#drafter input[type=radio]:not(:checked)").first
    radio.wait_for()
    colour = radio.evaluate("e => getComputedStyle(e).borderTopColor")
    red, green, blue = (int(v) for v in colour[colour.index("(") + 1:colour.index(")")].split(",")[:3])
    assert min(red, green, blue) >= 150, colour
    assert overflow(page) <= 0
    stop_and_close(page)


def test_a_tap_or_enter_pins_a_token_panel(app_url, browser):
    page = open_page(browser, app_url, 390, 844, touch=True)
    run_and_wait_for_a_verdict(page, seconds=60)          # where it appears is the other tests' business
    page.wait_for_function("/Finished|could not/.test(document.querySelector('#stats').textContent)",
                           timeout=120_000, polling=250)
    token = page.locator("#tokens [data-verdict]").last
    token.scroll_into_view_if_needed()
    token.tap()
    panel = page.locator("#sv-pin")
    panel.wait_for(state="visible", timeout=5_000)
    details = panel.inner_text()
    assert "cycle" in details and ("draft p" in details or "target p" in details or "p in the" in details), details
    page.keyboard.press("Escape")
    panel.wait_for(state="hidden", timeout=5_000)
    drafted = page.locator('#tokens [data-verdict="accepted"], #tokens [data-verdict="rejected"]').first
    drafted.focus()                                              # tokens take the keyboard focus
    page.keyboard.press("Enter")
    panel.wait_for(state="visible", timeout=5_000)
    details = panel.inner_text()
    assert "draft p = " in details and "target p = " in details and "cycle " in details, details
    assert "accepted" in details or "rejected" in details
    stop_and_close(page)
