"""Command line: `python -m specviz run | compare | bench | load | replay | report | train-draft` (the dispatcher is
`cli.main`, what the subcommands share `cli.common`)."""

from .main import build_parser, entry

__all__ = ["build_parser", "entry"]
