"""Command line: `python -m specviz run | compare | bench`.

`run` decodes one prompt speculatively, prints the text with every cycle's verdicts coloured in
the terminal, then a summary; `--baseline` also runs plain decoding and reports the measured
speedup and, for greedy runs, whether the two outputs are identical."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import torch

SUBCOMMANDS = {"run": "specviz.cli", "compare": "specviz.compare", "bench": "specviz.bench"}


# ----------------------------------------------------------------------------- shared flags

def add_model_arguments(parser: argparse.ArgumentParser, *, draft_repeatable: bool = False) -> None:
    parser.add_argument("--target", default=None, help="hub id, local folder or .gguf file (default: the built-in SmolLM2-135M-Instruct)")
    draft_help = "draft model (hub id, folder, .gguf), 'ngram' (prompt lookup) or 'self:L' (early exit after layer L)"
    if draft_repeatable:
        parser.add_argument("--draft", action="append", default=None, help=draft_help + "; repeat to compare")
    else:
        parser.add_argument("--draft", default=None, help=draft_help + " (default: ngram)")
    parser.add_argument("--dtype", default="auto", help="auto, float32, bfloat16 or float16")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--raw", action="store_true", help="raw completion: do not apply the chat template")


def add_decoding_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--k", type=int, default=4, help="draft length (tokens proposed per cycle)")
    parser.add_argument("--dynamic-k", action="store_true", help="grow k after fully accepted cycles, shrink after rejections")
    parser.add_argument("--max-k", type=int, default=None, help="upper bound for --dynamic-k (default 2k)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy verification")
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)


def fail(message: str, code: int = 2) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


# ----------------------------------------------------------------------------- run

def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    add_decoding_arguments(parser)
    parser.add_argument("--baseline", action="store_true", help="also run plain decoding and report the measured speedup")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write config, text, cycles and summary as JSON")
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    parser.add_argument("prompt", help="the prompt")


# Terminal styles per verdict: colour plus a second cue (strike-through, underline, bold) so the
# verdicts stay readable without colour.
RICH_STYLES = {"accepted": "green", "rejected": "red strike", "resampled": "dark_orange underline",
               "bonus": "magenta bold underline"}


def rich_text(pieces_per_cycle):
    from rich.text import Text

    text = Text()
    for i, pieces in enumerate(pieces_per_cycle):
        if i:
            text.append("|", style="dim")   # cycle boundary
        for piece in pieces:
            text.append(piece.text, style=RICH_STYLES[piece.verdict])
    return text


def progress_printer(quiet: bool):
    def report(fraction: float, message: str) -> None:
        if not quiet:
            print(f"[{fraction:4.0%}] {message}", file=sys.stderr)
    return report


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .runs import RunConfig, RunFailed, execute

    console = Console(no_color=args.no_color, highlight=False)
    try:
        result = execute(RunConfig.from_args(args), args.prompt, baseline=args.baseline,
                         progress=progress_printer(quiet=False))
    except RunFailed as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("cancelled", 130)

    console.print(rich_text(result.pieces))
    console.print()
    console.print("legend: " + "  ".join(f"[{style}]{name}[/]" for name, style in RICH_STYLES.items())
                  + "  [dim]| cycle boundary[/]")
    for line in result.summary_lines():
        console.print(line)
    if args.json:
        args.json.write_text(json.dumps(result.to_json(), indent=2))
        console.print(f"wrote {args.json}")
    return 0


# ----------------------------------------------------------------------------- entry point

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m specviz", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    helps = {"run": "decode one prompt and show every cycle",
             "compare": "compare drafters or pairs on one prompt, or sweep k",
             "bench": "benchmark against plain decoding and transformers' assisted generation"}
    for name, module in SUBCOMMANDS.items():
        try:
            mod = importlib.import_module(module)
        except ImportError:
            continue
        p = sub.add_parser(name, help=helps[name], description=helps[name])
        mod.add_arguments(p)
        p.set_defaults(handler=mod.main)
    return parser


def entry(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_grad_enabled(False)
    return args.handler(args)
