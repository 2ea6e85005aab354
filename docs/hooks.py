"""mkdocs hook: the pages show images from the repository's assets/ folder as `../assets/x.png`, a link
that reads right on GitHub and on the Space's file browser. mkdocs only sees files under docs/, so this
adds every file of assets/ that a page links to, at assets/ in the site, and rewrites those links to
point at it. A link to a file that does not exist stays as written, and `mkdocs build --strict` fails on
it like on any other broken link."""

import re
from pathlib import Path

from mkdocs.structure.files import File

ASSETS = Path(__file__).resolve().parent.parent / "assets"
ASSET_LINK = re.compile(r"\]\(\.\./assets/([^)\s#]+)")


def on_files(files, config):
    linked = set()
    for page in Path(config["docs_dir"]).glob("*.md"):
        linked.update(ASSET_LINK.findall(page.read_text(encoding="utf-8")))
    for name in sorted(linked):
        if (ASSETS / name).is_file():
            files.append(File.generated(config, f"assets/{name}", abs_src_path=str(ASSETS / name)))
    return files


def on_page_markdown(markdown, page, config, files):
    # ../assets/x.png from a page at the docs root is assets/x.png in the site.
    return ASSET_LINK.sub(lambda m: f"](assets/{m.group(1)}" if files.get_file_from_path(f"assets/{m.group(1)}")
                          else m.group(0), markdown)
