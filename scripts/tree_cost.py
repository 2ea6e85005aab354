"""What a verification pass costs against the number of tokens it verifies, for a chain and for a
token tree of the same size, on the built-in model: `python scripts/tree_cost.py [--dtype D]`.
Prints ratios to a one-token step, each the median of repeated passes measured in one run (one
torch thread, thread CPU time on a CPU)."""

import argparse
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.core import trees  # noqa: E402
from specviz.core.timing import Clock  # noqa: E402
from specviz.models import load_pair  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--prefix", type=int, default=200, help="tokens already in the cache")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    pair = load_pair(None, "ngram", device="cpu", dtype=args.dtype)
    model, clock = pair.target, Clock(pair.device)
    prefix = torch.randint(100, 20000, (1, args.prefix))

    def pass_seconds(n: int, parents: list[int] | None) -> float:
        times = []
        for _ in range(args.repeats):
            cache = __import__("transformers").DynamicCache(config=model.config)
            model(prefix[:, :-1], cache=cache, logits_to_keep=1)
            tokens = (torch.cat([prefix[:, -1:], torch.randint(100, 20000, (1, n - 1))], dim=1) if n > 1
                      else prefix[:, -1:])
            extra = {}
            if parents is not None:
                mask, positions = trees.tree_inputs(parents, args.prefix - 1, 1, model.dtype, pair.device)
                extra = dict(attention_mask=mask, position_ids=positions)
            start = clock()
            model(tokens, cache=cache, logits_to_keep=n, **extra)
            times.append(clock() - start)
        return statistics.median(times)

    one = pass_seconds(1, None)
    print(f"{pair.target_name}, {str(pair.dtype).removeprefix('torch.')}, 1 thread, {args.prefix}-token cache, "
          f"timed by {clock.name}; a one-token step: {1000 * one:.1f} ms")
    print("| tokens in the pass | chain | tree (binary-ish) |\n|---:|---:|---:|")
    for n in (2, 4, 8, 16, 32):
        nodes = n - 1
        tree = [-1 if i < 2 else (i - 2) // 2 for i in range(nodes)]     # two children per node
        print(f"| {n} | {pass_seconds(n, None) / one:.2f}x | {pass_seconds(n, tree) / one:.2f}x |")


if __name__ == "__main__":
    main()
