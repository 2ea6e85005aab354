"""The package's shape, checked by tools rather than promised: the import contracts in
pyproject.toml (layers, gradio only in the UI, argparse only in the command line, no cycles), ruff's
rules (pyproject.toml's [tool.ruff]) and modules small enough to read."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 420          # "no module much over 400 lines"


def test_import_contracts_hold():
    lint = shutil.which("lint-imports") or pytest.fail("lint-imports is missing: pip install import-linter")
    result = subprocess.run([lint, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120,
                            env={"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"})
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or pytest.fail("ruff is missing: pip install ruff")
    result = subprocess.run([ruff, "check", "--no-cache", "--output-format", "concise", "."], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]


def test_modules_stay_small():
    sizes = {path.relative_to(ROOT).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
             for path in (ROOT / "specviz").rglob("*.py")}
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
