"""The HTML report and the replay/report commands: a report of recordings opens from disk in headless
Chromium with the network blocked and shows the token view, the charts and the summary; the
commands print or write what the recording holds and refuse bad files with one line."""

import re
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_pair import PROMPT

from specviz.cli import entry
from specviz.runs import execute
from specviz.runs import recording as rec
from specviz.settings import RunSettings
from specviz.views.report import report_html

from conftest import CHROMIUM
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    from tiny_pair import TinyModels

    models, folder = TinyModels(), tmp_path_factory.mktemp("recordings")
    paths = []
    for name, draft, temperature in (("lookup", "ngram", 0.0), ("sampled", "small", 0.9)):
        settings = RunSettings(fixed_k=True, target="tiny", draft=draft, k=4, max_new_tokens=200, chat=False,
                               temperature=temperature, seed=1)
        run = execute(settings, PROMPT + ' <x> & "y"', models.loader(settings), baseline=True)
        paths.append(rec.save(folder / f"{name}.json", [run]))
        LIVE[paths[-1]] = run
    return paths


LIVE = {}   # recording path -> the live run it was saved from


@pytest.mark.slow
def test_report_opens_offline_with_tokens_charts_and_summary(recorded, tmp_path):
    playwright = pytest.importorskip("playwright.sync_api")
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is absent: apt-get install -y chromium")
    out = tmp_path / "report.html"
    assert entry([*map(str, ["report", *recorded, "-o", out])]) == 0
    size = out.stat().st_size
    assert size < 2_000_000                     # plotly.js once (1.2 MB), then a few hundred tokens per run
    page_text = out.read_text(encoding="utf-8")
    assert page_text.count("* plotly.js (") == 1
    assert "&lt;x&gt; &amp;" in page_text and "<x>" not in page_text      # the prompt is escaped
    requests = []
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page()
        page.route("**/*", lambda route: (requests.append(route.request.url),
                                          route.continue_() if route.request.url.startswith("file:")
                                          else route.abort()))
        errors = []
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.goto(out.as_uri())
        page.wait_for_function("document.querySelectorAll('.js-plotly-plot .main-svg').length >= 8", timeout=30_000)
        assert page.locator("[data-verdict]").count() > 10
        assert page.locator("[data-verdict]").first.get_attribute("title")   # probabilities on hover
        assert page.locator(".sv-overview tr").count() == 3                 # header + two runs
        assert "Measured speedup" in page.locator("#run-0 .sv-stats").inner_text()
        if "SPECVIZ_REPORT_SCREENSHOT" in __import__("os").environ:
            page.screenshot(path=__import__("os").environ["SPECVIZ_REPORT_SCREENSHOT"], full_page=True)
        browser.close()
    assert not errors
    assert requests and all(url.startswith("file:") for url in requests), requests


def test_replay_fast_prints_the_recorded_text(recorded, capsys):
    from specviz.cli.terminal import rich_text

    assert entry(["replay", str(recorded[0]), "--fast", "--no-color"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(rich_text(LIVE[recorded[0]]).plain)     # what `run` printed live
    assert "tokens per target pass" in out and "measured speedup" in out


@pytest.mark.slow
def test_replay_plays_at_the_recorded_speed(recorded):
    run = rec.load(recorded[0]).runs[0]
    recorded_seconds = max(t for t, _ in rec.timeline(run))
    code = ("import sys, time; from specviz.cli import entry; t = time.monotonic(); "
            f"entry(['replay', {str(recorded[0])!r}, '--speed', '0.5', '--no-color']); "
            "print('elapsed', time.monotonic() - t, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    elapsed = float(re.search(r"elapsed ([0-9.]+)", done.stderr).group(1))
    assert elapsed >= 2 * recorded_seconds * 0.95      # half speed: at least twice the recorded time


def test_bad_recordings_end_as_one_error_line(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "specviz-recording", "version": 99, "runs": []}')
    assert entry(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "newer specviz" in err
    assert entry(["report", str(bad), "-o", str(tmp_path / "r.html")]) == 2
    assert "newer specviz" in capsys.readouterr().err and not (tmp_path / "r.html").exists()
    assert entry(["report", str(bad), "-o", str(tmp_path / "missing" / "r.html")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_report_of_one_recording_has_no_overview(recorded):
    page = report_html([rec.load(recorded[0])])
    assert 'class="sv-overview"' not in page and page.count('class="sv-run"') == 1
