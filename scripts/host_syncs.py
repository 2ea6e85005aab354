"""Count the host-device synchronisations of one batched speculative pass (and of one plain step).

A call that reads a tensor's values on the host (`tolist`, `item`, `int()`, `float()`, `bool()`, an
index, `nonzero`, `.cpu()`, `.numpy()`) waits for the device and copies: on a GPU each is a crossing.
This machine has no GPU, so they are counted where they are made (a torch function mode sees every
such call), on a tiny Llama with a draft model (every tensor the loop touches is a model's output,
so every counted call would cross). Prints syncs per pass for each batch size and k.

    python scripts/host_syncs.py [--batch 1,4,8] [--k 4]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

SYNCS = {"tolist", "item", "__bool__", "__int__", "__float__", "__index__", "nonzero", "cpu", "numpy"}


class CountSyncs(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") in SYNCS:
            self.count += 1
        return func(*args, **(kwargs or {}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", default="1,4,8")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=24)
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
            counts = []
            while True:
                with CountSyncs() as mode:
                    event = next(events, None)
                if event is None:
                    break
                counts.append(mode.count)
            steady = counts[1:] or counts          # the first pass also prefills
            print(f"batch {batch} k {args.k} {name}: {sum(steady) / len(steady):.1f} host syncs per pass "
                  f"(median {sorted(steady)[len(steady) // 2]}, {len(counts)} passes)")


if __name__ == "__main__":
    main()
