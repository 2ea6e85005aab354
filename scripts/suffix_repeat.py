"""The same request twice with one suffix drafter, on the built-in model (`python scripts/suffix_repeat.py`):
the second time it drafts the first answer. Prints tokens per pass and the decode-only speedup (with
its 95% range) against plain decoding of the same prompt, one torch thread, thread CPU time."""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.core.plain import autoregressive_decode  # noqa: E402 - after the sys.path insert
from specviz.core.decoding import speculative_decode  # noqa: E402 - after the sys.path insert
from specviz.core.drafters import PromptLookupDrafter, SuffixDrafter  # noqa: E402
from specviz.metrics import measure_speed  # noqa: E402
from specviz.models import encode_prompt, load_pair  # noqa: E402

torch.set_num_threads(1)
torch.set_grad_enabled(False)
pair = load_pair(None, "ngram", device="cpu")
prompt = "Write a short paragraph about why the sky is blue, for a ten-year-old."
ids = encode_prompt(pair.tokenizer, prompt)
eos = pair.eos_token_ids
steps = list(autoregressive_decode(pair.target, ids, 96, eos_token_id=eos))
def go(drafter):
    cycles = list(speculative_decode(pair.target, drafter, ids, 96, k=8, eos_token_id=eos))
    s = measure_speed(cycles, steps)
    return len(cycles), sum(len(c.emitted) for c in cycles), s.speedup, s.low, s.high
suffix = SuffixDrafter()
for name, d in [("ngram (chain)", PromptLookupDrafter()), ("suffix, first request", suffix),
                ("suffix, same request again", suffix)]:
    passes, tokens, sp, lo, hi = go(d)
    print(f"{name}: {tokens} tokens in {passes} passes ({tokens/passes:.2f} per pass), "
          f"speedup {sp:.2f}x ({lo:.2f}-{hi:.2f}x)")
