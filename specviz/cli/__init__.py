"""Command line: `python -m specviz run | compare | bench | replay | report`.

    run       one prompt decoded speculatively, every cycle's verdicts coloured in the terminal
    compare   several drafters or pairs on one prompt, or one drafter over k = 1..8 (`--sweep`)
    bench     the prompt set against plain decoding and transformers' assisted generation
    replay    a recording played back in the terminal (no model needed)
    report    recordings as one standalone HTML page (no model needed)

This package is the only place that reads argv: it builds `RunSettings` from the flags and passes
them through `settings.validate`, checks the prompt and every output path, and only then loads a
model. Every failure, argparse's included, ends as exactly one `error: ...` line on stderr (the
message from `errors.user_message`) with nothing printed on stdout before it; exit code 2 for what
the user can fix, 130 for Ctrl-C, 1 for the unexpected (with a traceback when SPECVIZ_DEBUG is set).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

import torch

from ..errors import SpecvizError, expected, user_message
from ..settings import LOCAL, RunSettings, validate

TARGET_HELP = "hub id, local folder or .gguf file (default: the built-in SmolLM2-135M-Instruct)"
DRAFT_HELP = ("draft model (hub id, folder, .gguf), 'ngram' (prompt lookup), 'ngram-tree' (prompt lookup as a token "
              "tree), 'suffix' (suffix decoding) or 'self:L' (early exit after layer L)")
HELPS = {"run": "decode one prompt and show every cycle",
         "compare": "compare drafters or pairs on one prompt, or sweep k",
         "bench": "benchmark against plain decoding and transformers' assisted generation",
         "replay": "play a recording back in the terminal",
         "report": "write recordings as one standalone HTML report",
         "load": "speculation under load: batched speculative against batched plain decoding per batch size and k"}


class UsageError(Exception):
    """argparse refused the command line (raised instead of its usage-and-exit)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line ends as the same one `error:` line as every other failure.
    Subparsers are made of this class too (add_subparsers uses the parent's class)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


# ----------------------------------------------------------------------------- shared flags

def add_model_arguments(parser: argparse.ArgumentParser, *, draft_repeatable: bool = False,
                        target_help: str = TARGET_HELP, draft_help: str = DRAFT_HELP) -> None:
    """--target, --draft, --dtype, --device, --raw and --threads."""
    parser.add_argument("--target", default=None, help=target_help)
    if draft_repeatable:
        parser.add_argument("--draft", action="append", default=None, help=draft_help + "; repeat to compare")
    else:
        parser.add_argument("--draft", default=None, help=draft_help + " (default: ngram)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")
    parser.add_argument("--threads", type=int, default=None, metavar="N",
                        help="torch CPU threads (default: torch's choice); with 1, events are timed by the "
                             "thread's own CPU time, which other programs on the machine cannot inflate")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    """The decoding settings. Numbers stay text here: `settings.validate` coerces and checks them,
    so '--k inf' and '--seed 2**80' get the same messages as in the app."""
    parser.add_argument("--k", default=4, help="draft length (tokens proposed per cycle)")
    parser.add_argument("--dynamic-k", action="store_true", help="grow k after fully accepted cycles, shrink after rejections")
    parser.add_argument("--max-k", default=None, help="upper bound for --dynamic-k (default 2k)")
    parser.add_argument("--temperature", default=0.0, help="0 = greedy verification")
    parser.add_argument("--top-k", default=0)
    parser.add_argument("--top-p", default=1.0)
    parser.add_argument("--seed", default=None)
    parser.add_argument("--max-new-tokens", default=128)
    parser.add_argument("--branch", default=None,
                        help="with a draft model or self:L: draft a token tree, expanding the BRANCH most probable "
                             "nodes per depth into their BRANCH most probable children (EAGLE-2's dynamic tree)")
    parser.add_argument("--tree-budget", default=None, help="with --branch: nodes the target verifies per pass (default 16)")


def add_prompt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    parser.add_argument("prompt", help="the prompt")


def settings_from(args: argparse.Namespace, **overrides) -> RunSettings:
    """The validated `RunSettings` the flags describe (flags a subcommand lacks keep their defaults)."""
    names = ("target", "draft", "k", "dynamic_k", "max_k", "temperature", "top_k", "top_p", "seed",
             "max_new_tokens", "dtype", "device", "branch", "tree_budget")
    values = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    values.update(chat=not args.raw, **overrides)
    return validate(RunSettings(**values), LOCAL)


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
    parent = path.parent
    if not parent.is_dir():
        raise SpecvizError(f"{flag} {path}: the folder {parent} does not exist.")
    if path.exists() and not os.access(path, os.W_OK):
        raise SpecvizError(f"{flag} {path}: the file is not writable.")
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


# ----------------------------------------------------------------------------- reporting

def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def progress_printer(quiet: bool = False) -> Callable[[float, str], None]:
    def report(fraction: float, message: str) -> None:
        if not quiet:
            print(f"[{fraction:4.0%}] {message}", file=sys.stderr)
    return report


def rich_table(title: str, headers, rows):
    from rich import box
    from rich.table import Table
    from rich.text import Text

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i else "left", no_wrap=not i)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))   # Text: a "[" in a label is not markup
    return table


# ----------------------------------------------------------------------------- entry point

def build_parser() -> argparse.ArgumentParser:
    # Imported here, not at the top: each subcommand module imports the helpers above. A subcommand
    # whose import fails fails the whole command line loudly rather than vanishing from it.
    from . import bench, compare, load, replay, run

    parser = Parser(prog="python -m specviz", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, add_arguments, main in (("run", run.add_arguments, run.main),
                                      ("compare", compare.add_arguments, compare.main),
                                      ("bench", bench.add_arguments, bench.main),
                                      ("replay", replay.add_replay_arguments, replay.replay_main),
                                      ("report", replay.add_report_arguments, replay.report_main),
                                      ("load", load.add_arguments, load.main)):
        p = sub.add_parser(name, help=HELPS[name], description=HELPS[name])
        add_arguments(p)
        p.set_defaults(handler=main)
    return parser


def entry(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as error:
        return fail(str(error))
    if getattr(args, "threads", None) is not None:
        if args.threads < 1:
            return fail(f"--threads must be at least 1, got {args.threads}.")
        torch.set_num_threads(args.threads)
    torch.set_grad_enabled(False)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return fail("cancelled", 130)
    except Exception as exc:  # noqa: BLE001 - every failure ends as one line; see the module docstring
        if os.environ.get("SPECVIZ_DEBUG") and not expected(exc):
            traceback.print_exc()
        return fail(user_message(exc), 2 if expected(exc) else 1)
