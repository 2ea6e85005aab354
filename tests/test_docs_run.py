"""The docs run: what README.md and docs/*.md tell a reader to type is typed here, so that a renamed
function or flag fails a test rather than a reader. Whatever blocks the pages hold when the suite runs
are checked; nothing below lists them.

- ```python blocks run unchanged (the built-in model is offline), a page's blocks in order in one
  namespace, as a reader would run them (slow). Quickly: each block compiles and every name it imports
  from specviz exists, and is callable where the block calls it.
- `python -m specviz ...`, in command blocks and in inline code: every flag is an option of that
  command's parser (built in-process), and a command block's line parses as a whole. A page's command
  blocks then run (slow), line by line in one folder, in-process, on the tiny pair (`--target tiny`)
  where it serves the drafts, else on the built-in model, with the work capped (`CAPS`). Not run, and
  reported as skipped: training, other engines (vLLM, llama.cpp), hub models, and what needs the
  output of a command not run.
- `python scripts/X.py ...` and `python app.py ...`: the script exists, and its arguments pass its own
  argparse parser (slow: one subprocess stops each script right after parsing).
- pytest lines: the files exist, `-m` names registered marks, `-k` words occur in the files; pip
  lines: the requirement files exist and pins agree with requirements*.txt; `bash scripts/X.sh` and
  `mkdocs` name files that exist.

A block that cannot run here is marked just above its fence, visibly in the markdown source:
`<!-- not run: needs a GPU -->`. Its commands are still parsed, and it shows as a skipped test with
that reason (`-ra` prints the reasons).
"""

from __future__ import annotations

import argparse
import ast
import functools
import importlib
import json
import re
import shlex
import subprocess
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from specviz.cli.main import COMMANDS, UsageError, build_parser, entry
from specviz.errors import SpecvizError
from specviz.models.sources import TINY_TARGET, resolve_source

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^ *```(\w*)[^\n]*\n(.*?)^ *```", re.DOTALL | re.MULTILINE)
NOT_RUN = re.compile(r"<!--\s*not run:\s*(.+?)\s*-->")
INLINE_CODE = re.compile(r"`([^`\n]+)`")
SHELL = {"bash", "sh", "shell", "console"}
LANGUAGES = {"py": "python", "python3": "python", "zsh": "bash"}
UNREADABLE = "(unbalanced quotes)"     # the first word of a shell line shlex cannot split
ENV_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
SEPARATORS = {"&&", "||", ";", "|", "&"}

# What a run here caps when the command has the flag: the docs' own values are still parsed.
CAPS = {"--max-new-tokens": "8", "--limit": "1", "--repeats": "1"}
OUTPUT_FLAGS = {"--out", "--json", "--record", "--export", "-o", "--animation"}
OTHER_ENGINES = {"vllm": "needs vLLM's own environment and a minute to start its server",
                 "llamacpp": "needs llama.cpp's server (xllamacpp)"}


# ----------------------------------------------------------------------------- reading the pages

@dataclass(frozen=True)
class Block:
    page: Path
    line: int                  # the opening fence's line, from 1
    language: str
    text: str
    not_run: str | None        # the reason of a `<!-- not run: ... -->` marker just above it

    @property
    def where(self) -> str:
        return f"{shown(self.page)}:{self.line}"


@dataclass(frozen=True)
class Command:
    where: str                 # page:line
    argv: tuple[str, ...]      # the words after any VAR=value assignments
    env: tuple[tuple[str, str], ...] = ()
    block: Block | None = None  # None: inline code in the prose
    notes: tuple[str, ...] = field(default=(), compare=False)


def shown(page: Path) -> str:
    return page.relative_to(ROOT).as_posix() if page.is_relative_to(ROOT) else page.name


def blocks(page: Path) -> list[Block]:
    text = page.read_text(encoding="utf-8")
    found = []
    for match in FENCE.finditer(text):
        above = text[:match.start()].rstrip().rsplit("\n", 1)[-1]
        marker = NOT_RUN.search(above)
        language = LANGUAGES.get(match.group(1).lower(), match.group(1).lower())
        found.append(Block(page, text.count("\n", 0, match.start()) + 1, language, match.group(2),
                           marker.group(1) if marker else None))
    return found


def split_shell(text: str) -> list[tuple[int, list[str]]]:
    """Simple commands as word lists, with the line (from 0) each starts on: continuations joined,
    comments and `$ ` prompts dropped, `&&`, `;` and pipes separating. A line shlex cannot split is
    `[UNREADABLE, line]`."""
    commands = []
    lines = text.split("\n")
    number = 0
    while number < len(lines):
        start, line = number, lines[number]
        while line.endswith("\\") and number + 1 < len(lines):
            number += 1
            line = line[:-1] + " " + lines[number]
        number += 1
        lexer = shlex.shlex(re.sub(r"^\s*\$ ", "", line), posix=True, punctuation_chars=";&|")
        lexer.whitespace_split = True
        current: list[str] = []
        try:
            for word in lexer:
                if word in SEPARATORS:
                    commands.append((start, current))
                    current = []
                else:
                    current.append(word)
        except ValueError:
            current = [UNREADABLE, line]
        commands.append((start, current))
    return [(start, words) for start, words in commands if words]


def command(where: str, words: list[str], block: Block | None) -> Command:
    env = []
    while words and ENV_ASSIGNMENT.match(words[0]):
        name, _, value = words[0].partition("=")
        env.append((name, value))
        words = words[1:]
    return Command(where, tuple(words), tuple(env), block)


def kind(cmd: Command) -> str | None:
    """What a command runs: 'specviz', 'pytest', 'script' (python X.py, app.py too), 'pip', 'shell
    script', 'mkdocs', or None (export, cd, ...: not checked)."""
    argv = cmd.argv
    if argv[:1] == (UNREADABLE,):
        return "unreadable" if cmd.block and cmd.block.language in SHELL else None
    python = bool(argv) and argv[0] in ("python", "python3")
    if python and argv[1:3] == ("-m", "specviz"):
        return "specviz"
    if (python and argv[1:3] == ("-m", "pytest")) or argv[:1] == ("pytest",):
        return "pytest"
    if (python and argv[1:3] == ("-m", "pip")) or argv[:1] in (("pip",), ("pip3",)):
        return "pip"
    if python and len(argv) > 1 and argv[1].endswith(".py"):
        return "script"
    if argv[:1] == ("bash",) and len(argv) > 1 and argv[1].endswith(".sh"):
        return "shell script"
    if argv[:1] == ("mkdocs",):
        return "mkdocs"
    return None


def args_of(cmd: Command) -> list[str]:
    """The words after the program: after `python -m specviz`, `python X.py`, `pytest`, `pip`."""
    argv = list(cmd.argv)
    skip = {"specviz": 3, "pytest": 3 if argv[0].startswith("python") else 1, "script": 2,
            "pip": 3 if argv[0].startswith("python") else 1, "shell script": 2, "mkdocs": 1}
    return argv[skip[kind(cmd)]:]


def commands(page: Path) -> list[Command]:
    """Every checked command of a page: each line of its shell blocks (and of blocks of no language
    that starts with one), and inline code in its prose that starts with one."""
    found = []
    for block in blocks(page):
        if block.language in SHELL or block.language in ("", "text"):
            for start, words in split_shell(block.text):
                found.append(command(f"{shown(page)}:{block.line + 1 + start}", words, block))
    text = page.read_text(encoding="utf-8")
    prose = FENCE.sub(lambda match: "\n" * match.group(0).count("\n"), text)
    for match in INLINE_CODE.finditer(prose):
        try:
            words = shlex.split(match.group(1))
        except ValueError:
            continue       # not a command (an unbalanced quote in some other code)
        found.append(command(f"{shown(page)}:{prose.count(chr(10), 0, match.start()) + 1}", words, None))
    return [cmd for cmd in found if kind(cmd) is not None]


# ----------------------------------------------------------------------------- python -m specviz

@functools.cache
def command_parser(name: str) -> argparse.ArgumentParser:
    parser = build_parser([name])
    subparsers = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return subparsers.choices[name]


def options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def flags(words: list[str]) -> list[str]:
    return [word.split("=", 1)[0] for word in words
            if word.startswith("-") and word != "-" and not re.fullmatch(r"-[\d.]+", word)]


def specviz_problems(cmd: Command) -> list[str]:
    args = args_of(cmd)
    if not args or args[0].startswith("-"):       # python -m specviz --help
        unknown = set(flags(args)) - {"-h", "--help"}
        return [f"python -m specviz takes no option {flag}" for flag in sorted(unknown)]
    name = args[0]
    if name.isupper():                            # a placeholder: python -m specviz COMMAND --help
        return []
    if name not in COMMANDS:
        return [f"no command {name!r} (there are {', '.join(COMMANDS)})"]
    parser = command_parser(name)
    problems = [f"{name} has no option {flag}" for flag in flags(args[1:]) if flag not in options(parser)]
    if cmd.block is not None and not problems and not {"-h", "--help"} & set(args):
        try:
            parser.parse_args(args[1:])
        except UsageError as error:
            problems.append(f"does not parse: {error}")
    return problems


def tiny_serves(drafts: list[str]) -> bool:
    """Whether the tiny pair builds every draft named (it refuses a head and most draft models)."""
    from specviz.models.tiny import tiny_pair

    try:
        for draft in drafts or [None]:
            tiny_pair(draft)
    except SpecvizError:
        return False
    return True


def values(args: list[str], flag: str) -> list[str]:
    found = []
    for i, word in enumerate(args):
        if word == flag and i + 1 < len(args):
            found.append(args[i + 1])
        elif word.startswith(flag + "="):
            found.append(word.split("=", 1)[1])
    return found


def from_the_hub(target: str) -> bool:
    try:
        return resolve_source(target).kind == "hub"
    except SpecvizError:     # not a model name at all: running it says so
        return False


def run_plan(page: Path) -> list[tuple[Command, str | None]]:
    """A page's command-block lines of `python -m specviz`, each with why it is not run here (None: it runs)."""
    plan = []
    outputs_not_made: set[str] = set()
    for cmd in commands(page):
        if cmd.block is None or kind(cmd) != "specviz":
            continue
        args = args_of(cmd)
        engines = [engine for engine in values(args, "--engine") if engine in OTHER_ENGINES]
        targets = [target for target in values(args, "--target") if target != TINY_TARGET]
        reason = None
        if cmd.block.not_run:
            reason = cmd.block.not_run
        elif args[:1] == ["train-draft"]:
            reason = "trains a head for minutes"
        elif engines:
            reason = OTHER_ENGINES[engines[0]]
        elif any(from_the_hub(target) for target in targets):
            reason = f"needs {targets[0]} from the hub"
        elif any(word == out or word.endswith(":" + out) for word in args[1:] for out in outputs_not_made):
            reason = "needs the output of a command not run here"
        if reason:
            outputs_not_made |= {out for flag in OUTPUT_FLAGS for out in values(args, flag)}
        plan.append((cmd, reason))
    return plan


def runnable_args(cmd: Command) -> list[str]:
    """The command's own words, then the caps: the tiny pair where no target is named and it serves
    the drafts, and less work (`CAPS`) where the command has the flag."""
    args = args_of(cmd)
    if not args or args[0] not in COMMANDS:      # python -m specviz --help
        return args
    parser_options = options(command_parser(args[0]))
    extra = []
    if "--target" in parser_options and not values(args, "--target") and tiny_serves(values(args, "--draft")):
        extra += ["--target", TINY_TARGET]
    for flag, value in CAPS.items():
        if flag in parser_options:
            extra += [flag, value]
    return args + extra


# ----------------------------------------------------------------------------- pytest, pip, files

def registered_marks() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    declared = re.search(r"^markers = \[(.*?)^\]", text, re.DOTALL | re.MULTILINE).group(1)
    return set(re.findall(r'^\s*"(\w+):', declared, re.MULTILINE)) | {"skip", "skipif", "xfail", "parametrize"}


PYTEST_VALUED = {"-k", "-m", "-n", "-p", "-o", "-c", "--durations", "--maxfail", "--dist", "--tb"}


def pytest_problems(cmd: Command) -> list[str]:
    args, problems, paths, chosen = args_of(cmd), [], [], {}
    i = 0
    while i < len(args):
        word = args[i]
        if word in PYTEST_VALUED and i + 1 < len(args):
            chosen[word] = args[i + 1]
            i += 2
            continue
        if not word.startswith("-"):
            paths.append(word.split("::", 1)[0])
        i += 1
    for path in paths:
        if not (ROOT / path).exists():
            problems.append(f"no test file {path}")
    words = lambda expression: set(re.findall(r"\w+", expression)) - {"and", "or", "not"}  # noqa: E731
    problems += [f"no mark {mark!r} is registered" for mark in sorted(words(chosen.get("-m", "")) - registered_marks())]
    files = [ROOT / path for path in paths if (ROOT / path).is_file()] or sorted((ROOT / "tests").glob("test_*.py"))
    source = "\n".join(file.read_text(encoding="utf-8") for file in files).lower()
    problems += [f"-k {word!r} matches nothing in {', '.join(shown(file) for file in files)}"
                 for word in sorted(words(chosen.get("-k", ""))) if word.lower() not in source]
    return problems


def pins() -> dict[str, str]:
    found = {}
    for file in ROOT.glob("requirements*.txt"):
        text = file.read_text(encoding="utf-8")
        for name, version in re.findall(r"^([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?==([^\s;#]+)", text, re.MULTILINE):
            found[name.lower()] = version
    return found


def pip_problems(cmd: Command) -> list[str]:
    args, problems = args_of(cmd), []
    problems += [f"no requirements file {name}" for name in values(args, "-r") if not (ROOT / name).is_file()]
    for word in args:
        name, equals, version = word.partition("==")
        pinned = pins().get(name.lower())
        if equals and pinned and pinned != version:
            problems.append(f"{name}=={version}, but requirements pin {name}=={pinned}")
    return problems


def file_problems(cmd: Command) -> list[str]:
    """The file a script, shell script or mkdocs line names exists. A script's flags pass its argparse
    parser (`test_scripts_parse_their_documented_arguments`); one that reads sys.argv itself names them."""
    what = kind(cmd)
    path = ROOT / ("mkdocs.yml" if what == "mkdocs" else cmd.argv[1])
    if not path.is_file():
        return [f"no file {path.relative_to(ROOT)}"]
    source = path.read_text(encoding="utf-8")
    if what != "script" or "argparse" in source:
        return []
    return [f"neither {path.name} nor specviz/ mentions {flag}" for flag in flags(list(cmd.argv[2:]))
            if flag not in source and f'"{flag}"' not in specviz_source()]


@functools.cache
def specviz_source() -> str:
    """specviz's code as text: where a script that reads sys.argv itself may leave a flag (`python app.py
    --mcp` is read by specviz.ui)."""
    return "\n".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "specviz").rglob("*.py")))


CHECKS = {"unreadable": lambda cmd: ["shlex cannot split it (unbalanced quotes?)"],
          "specviz": specviz_problems, "pytest": pytest_problems, "pip": pip_problems,
          "script": file_problems, "shell script": file_problems, "mkdocs": file_problems}


def command_problems(page: Path) -> list[str]:
    return [f"{cmd.where}: `{shlex.join(cmd.argv)}`: {problem}"
            for cmd in commands(page) for problem in CHECKS[kind(cmd)](cmd)]


# ----------------------------------------------------------------------------- python blocks

def import_problems(block: Block) -> list[str]:
    """The block compiles, and what it imports from specviz exists (and is callable where it is called)."""
    try:
        tree = ast.parse(block.text, block.where)
    except SyntaxError as error:
        return [f"{block.where}: does not compile: {error}"]
    called = {node.func.id for node in ast.walk(tree) if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)}
    problems = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "specviz"):
            continue
        try:
            module = importlib.import_module(node.module)
        except ImportError as error:
            problems.append(f"{block.where}: {error}")
            continue
        for alias in node.names:
            try:
                value = getattr(module, alias.name)
            except AttributeError:          # `from package import submodule` imports it
                try:
                    value = importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    problems.append(f"{block.where}: {node.module} has no {alias.name}")
                    continue
            if (alias.asname or alias.name) in called and not callable(value):
                problems.append(f"{block.where}: {node.module}.{alias.name} is called but is {type(value).__name__!r}, "
                                "not a function")
    return problems


def run_python_blocks(page: Path) -> list[str]:
    """A page's python blocks in order in one namespace, as a reader pastes them; the failures, each
    with its traceback (the marked blocks are left out)."""
    namespace = {"__name__": "__main__"}
    for block in blocks(page):
        if block.language != "python" or block.not_run:
            continue
        try:
            exec(compile(block.text, block.where, "exec"), namespace)    # noqa: S102 - the docs' own code
        except Exception:  # noqa: BLE001 - any failure of a documented example is the finding
            return [f"{block.where} fails:\n{traceback.format_exc(limit=-6)}"]
    return []


# ----------------------------------------------------------------------------- the tests

def pages_with(wanted) -> list[Path]:
    return [page for page in PAGES if any(wanted(block) for block in blocks(page))]


def marked_not_run() -> list[tuple[str, str]]:
    found = [(block.where, block.not_run) for page in PAGES for block in blocks(page) if block.not_run]
    found += [(cmd.where, reason) for page in PAGES for cmd, reason in run_plan(page)
              if reason and not (cmd.block and cmd.block.not_run)]
    return found


@pytest.fixture
def reader_folder(tmp_path, monkeypatch):
    """A folder like a checkout (the repository's files linked in) where what the docs write lands."""
    for entry_path in ROOT.iterdir():
        if not entry_path.name.startswith("."):
            (tmp_path / entry_path.name).symlink_to(entry_path)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("page", PAGES, ids=shown)
def test_every_documented_command_parses(page):
    assert command_problems(page) == []


@pytest.mark.parametrize("page", pages_with(lambda block: block.language == "python"), ids=shown)
def test_python_blocks_compile_and_their_imports_exist(page):
    assert [problem for block in blocks(page) if block.language == "python" for problem in import_problems(block)] == []


@pytest.mark.slow
@pytest.mark.parametrize("page", pages_with(lambda block: block.language == "python" and not block.not_run), ids=shown)
def test_python_blocks_run(page, reader_folder, all_threads):
    assert run_python_blocks(page) == []


@pytest.mark.slow
@pytest.mark.parametrize("page", [page for page in PAGES if any(reason is None for _, reason in run_plan(page))],
                         ids=shown)
def test_command_blocks_run(page, reader_folder, monkeypatch, capsys, all_threads):
    for cmd, reason in run_plan(page):
        if reason:
            continue
        for name, value in cmd.env:
            monkeypatch.setenv(name, value)
        args = runnable_args(cmd)
        started = time.perf_counter()
        try:
            code = entry(args)
        except SystemExit as stop:       # --help
            code = stop.code or 0
        _, err = capsys.readouterr()
        assert code == 0, f"{cmd.where}: python -m specviz {shlex.join(args)}\n{err[-3000:]}"
        with capsys.disabled():      # seen with -s: which line costs the time
            print(f"{cmd.where}: {time.perf_counter() - started:.1f} s wall: python -m specviz {shlex.join(args)}")


def script_commands() -> list[Command]:
    """`python X.py ARGS` lines whose script parses its arguments with argparse (others read sys.argv
    themselves: only their file is checked)."""
    found = []
    for page in PAGES:
        for cmd in commands(page):
            script = ROOT / cmd.argv[1] if kind(cmd) == "script" else None
            if script and script.is_file() and len(cmd.argv) > 2 and "argparse" in script.read_text(encoding="utf-8"):
                found.append(cmd)
    return found


# Runs each script as __main__ with argparse stopping it right after parsing its arguments.
PARSE_ONLY = r"""
import argparse, contextlib, io, json, os, runpy, sys
class Parsed(Exception):
    pass
real = argparse.ArgumentParser.parse_args
def parse_and_stop(self, args=None, namespace=None):
    real(self, args, namespace)
    raise Parsed
argparse.ArgumentParser.parse_args = parse_and_stop
results = []
for script, args in json.loads(sys.argv[1]):
    sys.argv, said = [script, *args], io.StringIO()
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(said):
            runpy.run_path(script, run_name="__main__")
        results.append("ran without parsing its arguments")
    except Parsed:
        results.append(None)
    except SystemExit as stop:
        results.append(None if stop.code in (0, None) else said.getvalue().strip()[-500:] or f"exit {stop.code}")
    except Exception as error:
        results.append(f"{type(error).__name__}: {error}")
print(json.dumps(results))
"""


def parse_scripts(cmds: list[Command]) -> list[str]:
    jobs = [(str(ROOT / cmd.argv[1]), list(cmd.argv[2:])) for cmd in cmds]
    done = subprocess.run([sys.executable, "-c", PARSE_ONLY, json.dumps(jobs)], capture_output=True, text=True,
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    return [f"{cmd.where}: `{shlex.join(cmd.argv)}`: {result}" for cmd, result in zip(cmds, results) if result]


@pytest.mark.slow
def test_scripts_parse_their_documented_arguments():
    cmds = script_commands()
    assert cmds, "no documented script line with arguments found: the extraction is broken"
    assert parse_scripts(cmds) == []


NOT_RUN_HERE = marked_not_run() or [("-", "")]


@pytest.mark.parametrize("where, reason", NOT_RUN_HERE, ids=[where for where, _ in NOT_RUN_HERE])
def test_what_is_not_run_says_why(where, reason):
    """Each block marked `<!-- not run: ... -->` and each command not run here, as a skipped test
    with its reason: how many and why, in the summary."""
    if where == "-":
        pytest.skip("every block and command of the docs runs here")
    pytest.skip(f"{where} not run: {reason}")


# ----------------------------------------------------------------------------- the checks can fail

def test_the_checks_find_a_broken_example(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Old spelling:\n\n```python\nfrom specviz.runs import execute, load\nload(None)\n```\n\n"
                    "<!-- not run: needs a GPU -->\n```python\nraise RuntimeError('never run')\n```\n\n"
                    "```python\nfrom specviz.settings import RunSettings, no_such_name\n```\n\n"
                    "```bash\npython -m specviz run --no-such-flag \"hi\"\npython -m specviz rnu \"hi\"\n"
                    "python -m pytest -q tests/test_nowhere.py -m \"not fast\" && "
                    "pip install -r requirements-no.txt\n```\n\n"
                    "Inline: `python -m specviz bench --no-limit`, a name only: `python -m specviz COMMAND --help`, "
                    "`python app.py --no-such-flag`.\n")
    found = blocks(page)
    assert [block.not_run for block in found] == [None, "needs a GPU", None, None]
    assert [problem.split(": ", 1)[1] for block in found if block.language == "python"
            for problem in import_problems(block)] == [
        "specviz.runs.load is called but is 'module', not a function", "specviz.settings has no no_such_name"]
    problems = [problem.split("`: ", 1)[1] for problem in command_problems(page)]
    assert problems == ["run has no option --no-such-flag", "no command 'rnu' (there are " + ", ".join(COMMANDS) + ")",
                        "no test file tests/test_nowhere.py", "no mark 'fast' is registered",
                        "no requirements file requirements-no.txt", "bench has no option --no-limit",
                        "neither app.py nor specviz/ mentions --no-such-flag"]
    failures = run_python_blocks(page)
    assert len(failures) == 1 and failures[0].startswith("page.md:3 fails") and "not callable" in failures[0]


def test_a_whole_line_is_parsed_and_a_skipped_output_is_not_needed(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```bash\npython -m specviz run --k 8\n"
                    "python -m specviz train-draft --out heads/mine\npython -m specviz run --draft head:heads/mine \\\n"
                    "    \"hi\"  # a comment\npython -m specviz load --engine vllm --k 3\n```\n")
    assert "does not parse" in command_problems(page)[0]
    assert [(cmd.where, reason) for cmd, reason in run_plan(page)] == [
        ("page.md:2", None), ("page.md:3", "trains a head for minutes"),
        ("page.md:4", "needs the output of a command not run here"), ("page.md:6", OTHER_ENGINES["vllm"])]


def test_prompts_unbalanced_quotes_and_py_blocks(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("```console\n$ python -m specviz run --nope 'hi'\n```\n\n"
                    "```bash\npython -m specviz run 'hi\n```\n\n"
                    "```py\nimport specviz\n```\n\n```\nan untyped block: it's not a command\n```\n")
    assert [block.language for block in blocks(page)] == ["console", "bash", "python", ""]
    assert [problem.split("`: ", 1)[1] for problem in command_problems(page)] == [
        "run has no option --nope", "shlex cannot split it (unbalanced quotes?)"]
