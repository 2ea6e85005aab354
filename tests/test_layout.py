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


# ----------------------------------------------------------------------------- what an import costs

LAZY_PACKAGES = ["specviz", "specviz.runs", "specviz.models", "specviz.engines"]


@pytest.mark.parametrize("package", LAZY_PACKAGES)
def test_a_lazy_namespace_names_what_it_loads(package):
    """The names lazy_loader attaches are the ones the TYPE_CHECKING block imports (what readers and
    type checkers see), and every one of them loads from the module it is attached to."""
    import ast
    import importlib

    module = importlib.import_module(package)
    path = Path(module.__file__)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typed = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            for stmt in node.body:
                typed.update({alias.name: "." * stmt.level + stmt.module for alias in stmt.names})
    attached = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "attach":
            mapping = ast.literal_eval(next(k.value for k in node.keywords if k.arg == "submod_attrs"))
            attached = {name: "." + sub for sub, names in mapping.items() for name in names}
    assert attached and attached == typed
    # A module imported later would replace a name of the same spelling on its package (runs.load, the
    # load sweep, once hid the function that loads a pair).
    import pkgutil

    assert set(attached) & {info.name for info in pkgutil.iter_modules(module.__path__)} == set()
    for name, sub in attached.items():
        value = getattr(module, name)
        assert importlib.import_module(sub, package).__dict__[name] is value


def test_the_command_line_imports_only_what_its_command_needs():
    """`--help` imports neither torch, transformers, plotly nor gradio, nor any command's module (it
    took ~9 s before a word was printed); `replay`, `report` and the engine commands import no torch;
    a command's parser holds only that command's arguments."""
    code = ("import sys; from specviz.cli import entry\n"
            "try:\n    entry(['--help'])\nexcept SystemExit:\n    pass\n"
            "heavy = sorted(m for m in ('torch', 'transformers', 'plotly', 'gradio') if m in sys.modules)\n"
            "commands = sorted(m for m in sys.modules if m.startswith('specviz.cli.') and m != 'specviz.cli.common')\n"
            "print(heavy, commands)")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "{run,compare,bench,load,replay,report,train-draft}" in result.stdout
    assert result.stdout.strip().splitlines()[-1] == "[] ['specviz.cli.main']"
    # What needs no model imports no torch: replaying and reporting a recording, and the commands that
    # measure an engine's server (the local paths of load and compare import it when they run).
    code = ("import sys, specviz.cli.replay, specviz.views.report, specviz.engines, specviz.cli.load\n"
            "import specviz.cli.compare, specviz.runs.engine_load, specviz.runs.engine_compare\n"
            "print(sorted(m for m in ('torch', 'transformers', 'gradio') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "[]"

    from specviz.cli import main

    commands = next(a for a in main.build_parser(["replay"])._actions if a.dest == "command").choices
    assert sorted(name for name, p in commands.items() if p.get_default("handler")) == ["replay"]
    assert "--speed" in commands["replay"].format_help() and "--target" not in commands["run"].format_help()
