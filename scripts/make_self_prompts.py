"""Write assets/self_prompts.txt: user messages the built-in target writes itself, for training its draft
head on prompts more varied than templates (no dataset can be downloaded here).

The method is Magpie's (Xu et al. 2024, "Magpie: Alignment Data Synthesis from Scratch by Prompting Aligned
LLMs with Nothing"): an instruction-tuned model given only the chat template up to the start of a user turn
writes a user message, because that is what it has seen there. Sampled (temperature 1, top-p 0.95, a
fixed seed, so the file is reproducible on the same machine and dtype), batched, stopped at the end of the
turn; kept when it is one line of 20-300 characters, mostly ASCII letters, not a duplicate (case and
spacing ignored), not a benchmark or example prompt, and free of the topics of the chat prompts the
shipped head is measured on (make_train_prompts.HELD_OUT_WORDS):

    python scripts/make_self_prompts.py [--count 3000] [--seed 0] [--dtype bfloat16]

scripts/make_train_prompts.py mixes these with its template prompts into assets/train_prompts.txt."""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from specviz.catalog import load_examples, preset_prompt_sets  # noqa: E402
from specviz.core.plain import batched_autoregressive_decode  # noqa: E402
from specviz.models import load_model  # noqa: E402

sys.path.insert(0, str(ROOT / "scripts"))
from make_train_prompts import HELD_OUT_WORDS  # noqa: E402

OUT = ROOT / "assets" / "self_prompts.txt"
MARK = "\x00USER\x00"


def pre_query(tokenizer) -> list[int]:
    """The chat template's tokens up to where a user message begins (with its default system turn)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": MARK}], tokenize=False,
                                         add_generation_prompt=False)
    return tokenizer(text[:text.index(MARK)], add_special_tokens=False).input_ids


def normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().lower())


def keep(text: str) -> bool:
    if "\n" in text.strip() or not 20 <= len(text.strip()) <= 300:
        return False
    letters = sum(c.isascii() and c.isalpha() for c in text)
    return (letters >= 0.6 * len(text) and "<|" not in text
            and not any(word in text.lower() for word in HELD_OUT_WORDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    torch.set_grad_enabled(False)
    model, tokenizer = load_model("SmolLM2-135M-Instruct", dtype=args.dtype)
    start = pre_query(tokenizer)
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    measured = {normal(p.prompt) for prompts in preset_prompt_sets().values() for p in prompts}
    measured |= {normal(e["prompt"]) for e in load_examples()}
    seen, kept, written, batches, began = set(measured), [], 0, 0, time.monotonic()
    while len(kept) < args.count:
        outputs = [[] for _ in range(args.batch)]
        for event in batched_autoregressive_decode(model, [start] * args.batch, max_new_tokens=args.max_new_tokens,
                                                   temperature=1.0, top_p=0.95, seed=args.seed * 100_000 + batches,
                                                   eos_token_id=[end, tokenizer.eos_token_id]):
            for row, token in zip(event.requests, event.tokens):
                outputs[row].append(token)
        batches += 1
        for tokens in outputs:
            written += 1
            if not tokens or tokens[-1] not in (end, tokenizer.eos_token_id):
                continue                                    # cut by the budget: not a whole message
            text = tokenizer.decode(tokens[:-1], skip_special_tokens=True).strip()
            if keep(text) and normal(text) not in seen:
                seen.add(normal(text))
                kept.append(text)
        print(f"{len(kept)}/{args.count} kept of {written} written ({time.monotonic() - began:.0f} s)", flush=True)
        args.out.write_text("\n".join(kept[:args.count]) + "\n")      # after every batch: an interrupted run keeps them
    print(f"wrote {min(len(kept), args.count)} prompts to {args.out}")


if __name__ == "__main__":
    main()
