"""Count the host-device synchronisations of one batched speculative pass (and of one plain step):
reads back (device to host) and uploads (host to device), as `torch.cuda.set_sync_debug_mode` sees them.

This machine has no GPU, so both are counted where they are made (tests/crossings.py: a torch function
mode that tags the tensors built on the host and takes every other one to live on the model's
device), on a tiny Llama with a draft model. Prints both counts per pass for each batch size and k,
and with --where the line of specviz that made each crossing.

    python scripts/host_syncs.py [--batch 1,4,8] [--k 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from crossings import CountCrossings  # noqa: E402 - after the sys.path insert


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,4,8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--where", action="store_true", help="also list where each crossing is made")
    args = parser.parse_args()
    from conftest import make_llama, truncated_copy

    try:
        from specviz.core.plain import batched_autoregressive_decode
        from specviz.core.decoding import batched_speculative_decode
    except ImportError:        # before the one chain cycle: the batched loop had its own module
        from specviz.core.batched import batched_autoregressive_decode, batched_speculative_decode
    torch.set_num_threads(1)
    target = make_llama(0, layers=4)
    draft = truncated_copy(target, 1)
    for batch in [int(b) for b in args.batch.split(",")]:
        prompts = [torch.randint(4, 97, (1, 8 + 3 * row), generator=torch.Generator().manual_seed(row))
                   for row in range(batch)]
        for name, events in [("speculative", batched_speculative_decode(target, draft, prompts, args.tokens, k=args.k)),
                             ("plain", batched_autoregressive_decode(target, prompts, args.tokens))]:
            reads, uploads, where = [], [], {}
            while True:
                with CountCrossings(where if args.where else None) as mode:
                    event = next(events, None)
                if event is None:
                    break
                reads.append(mode.reads)
                uploads.append(mode.uploads)
            steady = slice(1, None) if len(reads) > 1 else slice(None)     # the first pass also prefills
            mean_reads, mean_uploads = (sum(c[steady]) / len(c[steady]) for c in (reads, uploads))
            print(f"batch {batch} k {args.k} {name}: {mean_reads + mean_uploads:.1f} host syncs per pass: "
                  f"{mean_reads:.1f} reads back, {mean_uploads:.1f} uploads ({len(reads)} passes)")
            for (kind, call, place), count in sorted(where.items(), key=lambda item: -item[1]):
                print(f"    {count:5d} {kind:9s} {call:10s} {place}")


if __name__ == "__main__":
    main()
