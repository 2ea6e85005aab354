"""Make animation / Download animation in headless Chromium, on a hosted-mode server with the tiny
models: in the Replay tab (a bundled recording, slow motion) and after a run in the Run tab, the GIF
arrives as a download and opens with Pillow."""

from pathlib import Path

import pytest
from conftest import CHROMIUM, running_app

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync"]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is absent: apt-get install -y chromium"),
]


def download_animation(page, prefix: str):
    """Press Make animation, wait for Download animation to be offered, press it: the GIF as Pillow opens it."""
    from PIL import Image
    from playwright.sync_api import expect

    button = page.locator(f"#{prefix}animation")
    expect(button).to_be_disabled()
    page.locator(f"#{prefix}make-animation").click()
    expect(button).to_be_enabled(timeout=120_000)
    with page.expect_download(timeout=60_000) as download:
        button.click()
    assert download.value.suggested_filename.endswith(".gif")
    image = Image.open(download.value.path())
    image.load()
    return image


def test_the_replay_and_run_tabs_offer_the_race_as_a_gif():
    from playwright.sync_api import sync_playwright

    with running_app(tiny=True) as app, sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 720}, accept_downloads=True)
        page.goto(app.url)

        page.get_by_role("tab", name="Replay").click()
        page.locator("#replay-speed").get_by_text("0.5\u00d7").click()
        image = download_animation(page, "replay-")
        assert image.format == "GIF" and image.size == (1280, 720) and image.n_frames >= 10

        page.get_by_role("tab", name="Run").click()
        page.locator("#run").click()
        page.wait_for_function("document.querySelector('#stats').innerText.includes('Finished')",
                               timeout=120_000, polling=250)
        image = download_animation(page, "")
        assert image.format == "GIF" and image.size == (1280, 720) and image.n_frames >= 3
        # A new run takes the last run's animation away.
        page.locator("#run").click()
        page.wait_for_function("document.querySelector('#stats').innerText.includes('Finished')",
                               timeout=120_000, polling=250)
        from playwright.sync_api import expect
        expect(page.locator("#animation")).to_be_disabled()
        browser.close()
