"""The README and the docs site: the site builds in strict mode (a broken link, a missing #anchor or a
page left out of the nav fails it), strict mode really does fail on those, and every relative link
in README.md and docs/*.md, #anchor included, reaches a file and a heading that exist as GitHub
renders them (the README is also the Hugging Face Space's card, so it stays a short front page)."""

import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = sorted((ROOT / "docs").glob("*.md"))
README_MAX_LINES = 250
TEST_COMMAND = "python -m pytest -q"         # what .ci/run runs, as the README gives it

LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
INLINE_CODE = re.compile(r"`[^`\n]*`")


def build_site(config: Path, site: Path) -> subprocess.CompletedProcess:
    if importlib.util.find_spec("material") is None:
        pytest.fail("mkdocs-material is missing: pip install -r requirements-test.txt")
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"})


def github_slug(heading: str) -> str:
    """The #anchor GitHub gives a heading: inline markup dropped, lower case, punctuation removed,
    each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"[`*]", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", page.read_text(encoding="utf-8")), re.MULTILINE):
        slug = github_slug(heading)
        found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
        seen[slug] = seen.get(slug, 0) + 1
    return found


def broken_links(page: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):                     # https:, mailto: (not checked offline)
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(f"{target}: no file {file}")
        elif anchor and anchor not in anchors(file):
            broken.append(f"{target}: {file.name} has no heading with the anchor #{anchor}")
    return broken


@pytest.mark.parametrize("page", [ROOT / "README.md", *PAGES], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_the_link_check_sees_a_broken_file_and_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Other\n\n## Where it is\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](other.md#where-it-is) [gone](missing.md) [no anchor](other.md#elsewhere)\n"
                    "![img](other.md) `[in code](nowhere.md)` [here](#page)\n\n# Page\n")
    assert [b.split(":")[0] for b in broken_links(page)] == ["missing.md", "other.md#elsewhere"]


def test_github_slugs():
    assert github_slug("Compare, sweep, step through, export") == "compare-sweep-step-through-export"
    assert github_slug("Measured: vLLM against specviz's own loop") == "measured-vllm-against-specvizs-own-loop"
    assert github_slug("The `run` command") == "the-run-command"


def test_readme_is_a_short_front_page():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) < README_MAX_LINES
    # The Space's front matter opens the file; the first two commands are the app and the test suite.
    assert readme.startswith("---\n") and "\nsdk: gradio\n" in readme.split("\n---\n", 1)[0]
    commands = re.findall(r"^```bash\n(.*?)\n```", readme, re.DOTALL | re.MULTILINE)
    assert commands[0].endswith("python app.py") and commands[1].endswith(TEST_COMMAND)
    assert f"\n{TEST_COMMAND}\n" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    # Every page of the docs is one link away from the README.
    linked = {target.partition("#")[0] for target in LINK.findall(readme)}
    assert {f"docs/{page.name}" for page in PAGES} <= linked


@pytest.mark.slow
def test_docs_site_builds_in_strict_mode(tmp_path):
    result = build_site(ROOT / "mkdocs.yml", tmp_path / "site")
    assert result.returncode == 0, result.stderr[-3000:]
    for page in PAGES:
        built = "index.html" if page.stem == "index" else f"{page.stem}/index.html"
        assert (tmp_path / "site" / built).is_file(), built
    # The screenshots come from the repository's assets/, copied in and linked from the page.
    assert (tmp_path / "site" / "assets" / "laptop.png").read_bytes() == (ROOT / "assets" / "laptop.png").read_bytes()
    assert 'src="../assets/laptop.png"' in (tmp_path / "site" / "app" / "index.html").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["[gone](missing.md)", "[no anchor](app.md#no-such-heading)",
                                 "![no image](../assets/no-such-image.png)"])
def test_strict_build_fails_on_a_broken_link(tmp_path, bad):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    with open(tmp_path / "docs" / "index.md", "a", encoding="utf-8") as page:
        page.write(f"\n{bad}\n")
    result = build_site(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert result.returncode != 0
    target = bad[bad.index("(") + 1:-1]
    assert f"Doc file 'index.md' contains a link '{target}'" in result.stderr, result.stderr[-3000:]
