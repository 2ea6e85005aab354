"""Command line: `python -m specviz run | compare | bench | load | replay | report | train-draft`.

    run       one prompt decoded speculatively, every cycle's verdicts coloured in the terminal
    compare   several drafters or pairs on one prompt, or one drafter over k = 1..8 (`--sweep`)
    bench     the prompt set against plain decoding and transformers' assisted generation
    load      batched speculative against batched plain decoding, per batch size and k (the crossover)
    replay    a recording played back in the terminal (no model needed)
    report    recordings as one standalone HTML page (no model needed)
    train-draft   a draft head trained for a target from its own text (`--draft head:DIR`)

Each command's module is imported only when that command runs (`COMMANDS`): `--help`, `replay`,
`report` and the engine commands start without torch, and `run` does not import what `bench` needs.

This package is the only place that reads argv: it builds `RunSettings` from the flags and passes
them through `settings.validate`, checks the prompt and every output path, and only then loads a
model. Every failure, argparse's included, ends as exactly one `error: ...` line on stderr (the
message from `errors.user_message`) with nothing printed on stdout before it; exit code 2 for what
the user can fix, 130 for Ctrl-C, 1 for the unexpected (with a traceback when SPECVIZ_DEBUG is set).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Iterable

from ..errors import expected, user_message
from .common import fail

HELPS = {"run": "decode one prompt and show every cycle",
         "compare": "compare drafters or pairs on one prompt, or sweep k",
         "bench": "benchmark against plain decoding and transformers' assisted generation",
         "load": "speculation under load: batched speculative against batched plain decoding per batch size and k",
         "replay": "play a recording back in the terminal",
         "report": "write recordings as one standalone HTML report",
         "train-draft": "train a draft head for a target from the target's own text"}


class UsageError(Exception):
    """argparse refused the command line (raised instead of its usage-and-exit)."""


class Parser(argparse.ArgumentParser):
    """argparse, but a bad command line ends as the same one `error:` line as every other failure.
    Subparsers are made of this class too (add_subparsers uses the parent's class)."""

    def error(self, message: str):
        raise UsageError(f"{message} (see {self.prog} --help)")


# name: (module of this package, its add-arguments function, its main function)
COMMANDS = {"run": ("run", "add_arguments", "main"),
            "compare": ("compare", "add_arguments", "main"),
            "bench": ("bench", "add_arguments", "main"),
            "load": ("load", "add_arguments", "main"),
            "replay": ("replay", "add_replay_arguments", "replay_main"),
            "report": ("replay", "add_report_arguments", "report_main"),
            "train-draft": ("train_draft", "add_arguments", "main")}


def build_parser(commands: Iterable[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with `commands` only those commands' arguments (every command is
    still listed with its help line; the others' modules are not imported)."""
    chosen = set(COMMANDS if commands is None else commands)
    parser = Parser(prog="python -m specviz", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, (module, add_arguments, main) in COMMANDS.items():
        p = sub.add_parser(name, help=HELPS[name], description=HELPS[name])
        if name in chosen:
            handlers = importlib.import_module(f".{module}", __package__)
            getattr(handlers, add_arguments)(p)
            p.set_defaults(handler=getattr(handlers, main))
    return parser


# No log file exists on the command line: the honest place for the details is a traceback.
DETAILS = "Run again with SPECVIZ_DEBUG=1 for the traceback."


def entry(argv: list[str] | None = None) -> int:
    given = sys.argv[1:] if argv is None else argv
    try:     # the command is the first word: the top level takes no option but --help
        args = build_parser(given[:1]).parse_args(given)
    except UsageError as error:
        return fail(str(error))
    if getattr(args, "threads", None) is not None:
        if args.threads < 1:
            return fail(f"--threads must be at least 1, got {args.threads}.")
        from ..models.devices import use_threads

        use_threads(args.threads)       # without it: one thread on a CPU, set where a run starts
    if "torch" in sys.modules:      # the command's module runs a model here (the decoding loops are
        sys.modules["torch"].set_grad_enabled(False)       # in inference mode anyway)
    try:
        return args.handler(args)
    except KeyboardInterrupt:
        return fail("cancelled", 130)
    except BrokenPipeError:
        # Whoever read stdout has gone (`| head`): nothing is left to say there. Point stdout at
        # /dev/null so that Python's own flush at exit does not fail on the closed pipe too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except Exception as exc:  # noqa: BLE001 - every failure ends as one line; see the module docstring
        debugging = bool(os.environ.get("SPECVIZ_DEBUG"))
        if debugging and not expected(exc):
            traceback.print_exc()
        return fail(user_message(exc, details="The traceback is above." if debugging else DETAILS),
                    2 if expected(exc) else 1)
