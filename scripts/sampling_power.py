"""How many runs the whole-run chi-square tests need (tests/test_sampling.py, and test_head.py's and
test_batched.py's sampling tests): for each prompt and sampler setting there, the share
of 1,000 simulated sets of N draws from a sampler at 1.25 times the temperature (a subtler fault than the
tests' power check at twice) that the test rejects at p < 1e-4. The tests take the smallest N with at
least 99% (tests/test_sampling.py says which setting keeps more).

    python scripts/sampling_power.py          # about 3 minutes on one core

Power depends on the exact distribution and the alternative only, not on the drafter, so one line stands
for every drafter tested at that setting."""

import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from conftest import make_llama                                  # noqa: E402
from test_sampling import V, exact_joint, pooled_chisquare       # noqa: E402

from specviz.core.sampling import Sampler                        # noqa: E402

CHAIN, TREE = [[1, 2, 3, 1, 2]], [[1, 2, 3, 1, 2, 4, 1, 2, 5, 1, 2]]
SETTINGS = {                                # the prompts and samplers of test_sampling's whole-run tests
    "T 1.0": (CHAIN, dict(temperature=1.0)),
    "T 0.8, top-k 3": (CHAIN, dict(temperature=0.8, top_k=3)),
    "T 1.3, top-p 0.7": (CHAIN, dict(temperature=1.3, top_p=0.7)),
    "T 1.0, top-p 0.8, top-k 4": (CHAIN, dict(temperature=1.0, top_p=0.8, top_k=4)),
    "T 0.7, top-k 4": (CHAIN, dict(temperature=0.7, top_k=4)),
    "tree prompt, T 1.0": (TREE, dict(temperature=1.0)),
    "tree prompt, T 0.8, top-k 4": (TREE, dict(temperature=0.8, top_k=4)),
    "batched row [4], T 1.0": ([[4]], dict(temperature=1.0)),                  # test_batched's other rows
    "batched row [0 5 ...], T 1.0": ([[0, 5, 0, 5, 0, 5, 2, 1]], dict(temperature=1.0)),
}
HEAD_VOCAB, HEAD_LENGTH = 5, 4            # test_head's sampling test: its own target, four tokens


def main() -> None:
    torch.set_num_threads(1)
    target = make_llama(0, layers=2, vocab=V, hidden=32)          # test_sampling.small_pair's target
    rng = np.random.default_rng(0)
    head_target = make_llama(0, layers=2, vocab=HEAD_VOCAB, hidden=32)
    cases = [(name, target, prompt, kw, V, 3) for name, (prompt, kw) in SETTINGS.items()]
    cases.append(("test_head: T 1.0, 4 tokens", head_target, CHAIN, dict(temperature=1.0), HEAD_VOCAB, HEAD_LENGTH))
    for name, model, prompt, kw, vocab, length in cases:
        top_k, top_p = kw.get("top_k", 0), kw.get("top_p", 1.0)
        exact = exact_joint(model, torch.tensor(prompt), Sampler(kw["temperature"], top_k, top_p), length, vocab)
        wrong = exact_joint(model, torch.tensor(prompt), Sampler(kw["temperature"] * 1.25, top_k, top_p), length, vocab)
        wrong = wrong / wrong.sum()
        shares = []
        for n in (1000, 1500, 2000, 2500):
            hits = sum(pooled_chisquare(rng.multinomial(n, wrong).astype(float), exact) < 1e-4 for _ in range(1000))
            shares.append(f"N={n}: {hits / 10:5.1f}%")
        print(f"{name:28s}", "  ".join(shares), flush=True)


if __name__ == "__main__":
    main()
