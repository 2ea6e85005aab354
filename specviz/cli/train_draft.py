"""`python -m specviz train-draft`: train an EAGLE-3 draft head (core.eagle3) for a target from the
target itself (runs.train_draft): the target writes its own continuations of the prompts, its hidden
states are collected, the head is trained with a progress bar of the loss and the held-out agreement
per epoch, and saved to --out in the speculators format (config.json + model.safetensors, which vLLM
serves). Run it again with the same --out to resume; Ctrl-C keeps the last finished epoch. Use the
head with `--draft head:DIR`."""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

from ..catalog import MAX_TRAINING_PROMPTS, TRAIN_PROMPTS_FILE
from ..errors import SpecvizError
from ..runs.run import load
from ..runs.train_draft import NEW_HEAD_K, TrainOptions, train_head
from ..settings import number, whole_number
from .common import TARGET_HELP, progress_printer, read_prompts, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help=TARGET_HELP + "; 'tiny': the tiny in-process Llama")
    parser.add_argument("--prompts", default=str(TRAIN_PROMPTS_FILE), metavar="SET_OR_FILE",
                        help="a prompt set or a file (one prompt per line, or JSON Lines); default: the shipped "
                             "training prompts, which share none with the benchmark and example sets")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the head is written")
    parser.add_argument("--tokens", default=TrainOptions.tokens, metavar="N", help="tokens for the target to generate")
    parser.add_argument("--minutes", default=TrainOptions.minutes, metavar="M",
                        help="time budget, generation (at most half) and training together")
    parser.add_argument("--epochs", default=TrainOptions.epochs)
    parser.add_argument("--draft-vocab", default=TrainOptions.draft_vocab, metavar="V",
                        help="rows of the head's output layer: the V most frequent tokens of the training text")
    parser.add_argument("--steps", default=TrainOptions.steps, metavar="S",
                        help="drafting steps unrolled in training (the training-time test)")
    parser.add_argument("--k", default=None, metavar="K",
                        help=f"the draft length written as the head's default (default {NEW_HEAD_K}, or the "
                             "--start head's)")
    parser.add_argument("--start", default=None, metavar="HEAD",
                        help="go on training this head ('head': the one shipped for the target, 'head:DIR_OR_ID': "
                             "a folder or hub id) on the new text: its layers, shape and draft vocabulary are kept")
    parser.add_argument("--lr", default=TrainOptions.lr, metavar="LR", help="peak learning rate")
    parser.add_argument("--dtype", default="auto", help="the target's dtype while it writes and reads the text")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--raw", action="store_true", help="raw completions: do not apply the chat template")
    parser.add_argument("--threads", type=int, default=None, metavar="N", help="torch CPU threads")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")


def main(args: argparse.Namespace) -> int:
    options = TrainOptions(tokens=whole_number("--tokens", args.tokens, 1, 100_000_000),
                           minutes=number("--minutes", args.minutes, 0.05, 24 * 60),
                           epochs=whole_number("--epochs", args.epochs, 1, 1000),
                           draft_vocab=whole_number("--draft-vocab", args.draft_vocab, 16, 1_000_000),
                           steps=whole_number("--steps", args.steps, 1, 16), lr=number("--lr", args.lr, 1e-7, 1.0),
                           k=None if args.k is None else whole_number("--k", args.k, 1, 32))
    if args.out.exists() and not args.out.is_dir():
        raise SpecvizError(f"--out {args.out}: not a folder.")
    prompts = [p.prompt for p in read_prompts(args.prompts, MAX_TRAINING_PROMPTS)]
    settings = settings_from(args, draft="ngram")
    pair = load(settings, None if args.quiet else progress_printer())
    started = time.monotonic()
    last = None
    try:
        for progress in train_head(pair.target, pair.tokenizer, prompts, args.out, target_name=pair.target_name,
                                   eos=pair.eos_token_ids, options=options, chat=not args.raw, start=args.start):
            last = progress
            if not args.quiet:
                bar = "#" * int(20 * progress.fraction)
                print(f"[{progress.stage:>8} {bar:<20}] {progress.message}", file=sys.stderr, flush=True)
    except KeyboardInterrupt:
        epochs = last.history[-1][0] if last and last.history else 0
        print(f"interrupted: {args.out} keeps epoch {epochs}" if epochs else "interrupted before the first epoch "
              "ended: nothing saved but the generated text (run again to resume)", file=sys.stderr)
        return 130
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"{last.message}; {(time.monotonic() - started) / 60:.1f} minutes, peak memory {peak:.0f} MiB. "
          f"Use it with --draft head:{args.out}")
    return 0
