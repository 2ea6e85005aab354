"""What the subcommands share: their common flags, the checks of output paths, outputs written
whole, recordings read within their size limit, and text made safe for the terminal.

Text from a recording or a model reaches the terminal only through `printable`: a shared recording
must not be able to clear the screen, retitle the window or write the clipboard (ESC and OSC
sequences), whether colour is on or not.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from ..catalog import MAX_PROMPTS, prompt_set, read_prompt_file
from ..errors import SpecvizError
from ..files import is_stream, read_limited, write_atomic
from ..models.head_files import default_k
from ..models.sources import DEFAULT_TARGET
from ..runs import recording
from ..settings import LOCAL, SAMPLING_RULES, RunSettings, validate

TARGET_HELP = "hub id, local folder or .gguf file (default: the built-in SmolLM2-135M-Instruct)"
DRAFT_HELP = ("draft model (hub id, folder, .gguf), 'ngram' (prompt lookup), 'ngram-tree' (prompt lookup as a token "
              "tree), 'suffix' (suffix decoding) or 'self:L' (early exit after layer L)")


# ----------------------------------------------------------------------------- shared flags

def add_model_arguments(parser: argparse.ArgumentParser, *, draft_repeatable: bool = False,
                        target_help: str = TARGET_HELP, draft_help: str = DRAFT_HELP) -> None:
    """--target, --draft, --dtype, --device, --raw and --threads."""
    parser.add_argument("--target", default=None, help=target_help)
    if draft_repeatable:
        parser.add_argument("--draft", action="append", default=None, help=draft_help + "; repeat to compare")
    else:
        parser.add_argument("--draft", default=None, help=draft_help + " (default: ngram)")
    parser.add_argument("--dtype", default="auto", help="auto (on a CPU float32, which keeps greedy outputs identical "
                        "to plain decoding's; on a GPU the serving dtype: the checkpoint's bf16 or fp16), float32, "
                        "bfloat16 or float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default on a CPU: 1, whose events are timed by the thread's own "
                             "CPU time, which other programs on the machine cannot inflate; with more, by the wall "
                             "clock, which they can)")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding settings. Numbers stay text here: `settings.validate` coerces and checks them,
    so '--k inf' and '--seed 2**80' get the same messages as in the app."""
    parser.add_argument("--k", default=None,
                        help="draft length (tokens proposed per cycle; default 4, a trained head's own best k)")
    parser.add_argument("--fixed-k", action="store_true",
                        help="draft k tokens every cycle (the classic algorithm); by default the cost-aware policy "
                             "drafts 0 to k a cycle, as many as this machine's measured pass costs and the request's "
                             "acceptance say will pay")
    parser.add_argument("--dynamic-k", action="store_true",
                        help="grow k after fully accepted cycles, shrink after rejections (transformers' heuristic)")
    parser.add_argument("--max-k", default=None, help="upper bound for --dynamic-k (default 2k)")
    parser.add_argument("--temperature", default=0.0, help="0 = greedy verification")
    parser.add_argument("--top-k", default=0)
    parser.add_argument("--top-p", default=1.0)
    parser.add_argument("--seed", default=None)
    add_sampling_argument(parser)
    parser.add_argument("--max-new-tokens", default=128)
    parser.add_argument("--branch", default=None,
                        help="with a draft model, self:L or a head: draft a token tree, expanding the BRANCH most "
                             "probable nodes per depth into their BRANCH most probable children (EAGLE-2's tree)")
    parser.add_argument("--tree-budget", default=None,
                        help="with --branch: nodes the target verifies per pass (default 16)")


def add_sampling_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sampling", default=None, choices=SAMPLING_RULES,
                        help="with --temperature > 0: 'invariant' (the default: drafter-invariant sampling, the "
                             "text is plain sampling's with the seed, whatever the drafter, k or policy) or "
                             "'classic' (Leviathan et al.'s rejection sampling: accepts more of a draft model's "
                             "tokens, but its text can follow the draft lengths)")


def add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    parser.add_argument("prompt", help="the prompt")


def read_prompts(value: str, max_prompts: int = MAX_PROMPTS):
    """--prompts: a prompt file (one per line, or JSON Lines), or a shipped set by name."""
    path = Path(value)
    if path.is_file():
        return read_prompt_file(path, max_prompts)
    if path.suffix or "/" in value:
        raise SpecvizError(f"--prompts {value}: no such file.")
    return prompt_set(value)


def load(settings: RunSettings, progress=None):
    """The model pair (`runs.run.load`), imported on first use: `load` and `compare` on an engine's
    server load no model in this process and start without torch. The commands import this name, so
    that a test can replace each command's loader."""
    from ..runs.run import load as load_pair

    return load_pair(settings, progress)


def settings_from(args: argparse.Namespace, **overrides) -> RunSettings:
    """The validated `RunSettings` the flags describe (flags a subcommand lacks keep their defaults)."""
    names = ("target", "draft", "k", "fixed_k", "dynamic_k", "max_k", "temperature", "top_k", "top_p", "seed",
             "sampling", "max_new_tokens", "dtype", "device", "branch", "tree_budget")
    values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    values.update(chat=not args.raw, **overrides)
    settings = validate(RunSettings(**values), LOCAL)
    if "k" not in values and settings.draft.kind == "head":
        # A trained head drafts best at the k it measured (its config's k), not the general default.
        settings = replace(settings, k=default_k(settings.draft, settings.target or DEFAULT_TARGET))
    return settings


# ----------------------------------------------------------------------------- output paths

def _probe_writable(folder: Path, flag: str) -> None:
    """Create and remove a file in `folder`: permission bits say nothing for root, nor for /proc."""
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".specviz-probe-"):
            pass
    except OSError as error:
        raise SpecvizError(f"{flag}: cannot write in {folder} ({error.strerror or error}).") from None


def check_output_file(path: Path | None, flag: str) -> None:
    """A file to write: its folder exists and is writable, and it is not a folder itself."""
    if path is None:
        return
    if path.is_dir():
        raise SpecvizError(f"{flag} {path} is a folder: give a file name.")
    if path.exists() and not os.access(path, os.W_OK):
        raise SpecvizError(f"{flag} {path}: the file is not writable.")
    if is_stream(path):
        return
    parent = path.resolve().parent
    if not parent.is_dir():
        raise SpecvizError(f"{flag} {path}: the folder {parent} does not exist.")
    _probe_writable(parent, flag)


def check_output_folder(path: Path | None, flag: str) -> None:
    """A folder to write into (created if missing): not a file, and its parent exists and is writable."""
    if path is None:
        return
    if path.exists() and not path.is_dir():
        raise SpecvizError(f"{flag} {path} is a file, not a folder: give a folder to write into.")
    if path.is_dir():
        _probe_writable(path, flag)
        return
    if not path.parent.is_dir():
        raise SpecvizError(f"{flag} {path}: the folder {path.parent} does not exist.")
    _probe_writable(path.parent, flag)


def write_output(path: Path, text: str) -> Path:
    """An output file written whole or not at all (`files.write_atomic`; a device or a pipe in place)."""
    return write_atomic(path, text)


def read_recording(path: Path) -> recording.Recording:
    """A recording file, read up to the recordings' size limit and no further: a device or a pipe
    reports size 0, so the size a file claims is not enough."""
    return recording.loads(read_limited(path, recording.MAX_BYTES, "a recording"), path.name)


# ----------------------------------------------------------------------------- the terminal

# Control characters but newline and tab: C0, DEL and C1 (ESC, CSI and OSC start the sequences
# that clear the screen, set the title or write the clipboard), and lone surrogates, which no
# terminal encoding can write.
_UNPRINTABLE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)            # Unicode's control pictures: ESC shows as \u241b
    if code == 0x7F:
        return "\u2421"
    if code <= 0x9F:
        return f"\\x{code:02x}"              # C1 has no pictures: its escape, as Python writes it
    return "\ufffd"                          # a lone surrogate


def printable(text: str) -> str:
    """`text` with every control character but newline and tab made visible, and lone surrogates
    replaced: what any recorded or model text goes through before it reaches the terminal."""
    return _UNPRINTABLE.sub(_visible, text)


def make_console(no_color: bool = False, *, stderr: bool = False):
    from rich.console import Console

    return Console(no_color=no_color, highlight=False, emoji=False, stderr=stderr)


def say(console, line: str, **style) -> None:
    """One line of text (no markup, not wrapped), made printable."""
    console.print(printable(line), markup=False, soft_wrap=True, **style)


def fail(message: str, code: int = 2) -> int:
    print(f"error: {printable(message)}", file=sys.stderr)
    return code


def progress_printer(quiet: bool = False) -> Callable[[float, str], None]:
    def report(fraction: float, message: str) -> None:
        if not quiet:
            print(f"[{fraction:4.0%}] {printable(message)}", file=sys.stderr)
    return report


def print_table(console, table) -> None:
    """A table with every figure whole. A terminal keeps the table to its width; a pipe or a file has
    no width of its own (rich would assume 80 columns and cut cells to '1.3\u2026'), so there the
    table is as wide as its widest row."""
    from rich.measure import Measurement

    if console.is_terminal:
        console.print(table)
        return
    widest = Measurement.get(console, console.options.update_width(1 << 16), table).maximum
    width = console.width
    console.width = max(widest, width)     # print's own width= may only narrow the console's
    try:
        console.print(table)
    finally:
        console.width = width


def rich_table(title: str, headers, rows):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i else "left", no_wrap=not i)
    for row in rows:
        table.add_row(*(Text(printable(cell)) for cell in row))   # Text: a "[" in a label is not markup
    return table
