"""The text and features an EAGLE-3 draft head is trained on (runs.train_draft trains it): the target's
own greedy replies to the prompts, written in batches; its hidden states at the head's layers and its
next-token distribution at every position, from one forward per few sequences; the draft vocabulary;
the baseline a head must beat; and which prompts training holds out."""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence

import torch

from ..core.plain import batched_autoregressive_decode
from ..models import encode_prompt

HELD_OUT = 0.1                    # share of sequences kept for measuring agreement (the first ones written)
SEED = 0                          # the order the prompts are written in (training's default seed)


def shuffled(prompts: Sequence[str], seed: int) -> list[str]:
    """The order the target writes the prompts' replies in; the first HELD_OUT of the sequences are held out."""
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return order


def held_out_count(sequences: int) -> int:
    """How many of the sequences written (the first ones) training holds out."""
    return max(1, int(sequences * HELD_OUT))


def held_out_prompts(prompts: Sequence[str], seed: int = SEED) -> list[str]:
    """The prompts whose replies training on `prompts` holds out (when the budget writes them all)."""
    return shuffled(prompts, seed)[:held_out_count(len(prompts))]


def generate_sequences(target, tokenizer, prompts: Sequence[str], *, tokens: int, max_new_tokens: int, batch: int,
                       eos: Sequence[int], deadline: float, chat: bool = True
                       ) -> Iterator[tuple[int, list[list[int]], list[int]]]:
    """Yields (tokens generated so far, sequences, their prompts' lengths) after each batch of at most
    `batch` prompts, until `tokens` or the deadline. A batch takes no more prompts than the tokens still to write need
    at `max_new_tokens` each (at least two): a budget of 2,000 tokens wrote 12,288 in one batch of 64."""
    sequences, prompt_lengths, generated = [], [], 0
    encoded = [encode_prompt(tokenizer, p, chat=chat)[0].tolist() for p in prompts]
    start = 0
    while start < len(encoded):
        needed = max(2, math.ceil((tokens - generated) / max_new_tokens))
        rows = encoded[start:start + min(batch, needed)]
        start += len(rows)
        outputs = [[] for _ in rows]
        for event in batched_autoregressive_decode(target, rows, max_new_tokens=max_new_tokens,
                                                   eos_token_id=list(eos)):
            for row, token in zip(event.requests, event.tokens):
                outputs[row].append(token)
            if time.monotonic() > deadline:
                break
        for prompt, output in zip(rows, outputs):
            sequences.append(prompt + output)
            prompt_lengths.append(len(prompt))
            generated += len(output)
        yield generated, sequences, prompt_lengths
        if generated >= tokens or time.monotonic() > deadline:
            return


@torch.inference_mode()
def batched_target_features(target, sequences: Sequence[list[int]], layers: Sequence[int], top_k: int
                            ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """Per sequence: (n, len(layers) * H) the target's hidden states at `layers` (bf16), and its top_k
    next-token probabilities (n, top_k) (bf16) and their ids (n, top_k), from one forward over all:
    right-padded, so that no real position sees a padding one (attention is causal)."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)] = torch.tensor(sequence)
    out = target(ids.to(target.device), output_hidden_states=list(layers))
    states = torch.cat([out.hidden_states[i] for i in layers], dim=-1).to("cpu", torch.bfloat16)
    top = torch.softmax(out.logits.float(), dim=-1).topk(top_k, dim=-1)
    probs, top_ids = top.values.to("cpu", torch.bfloat16), top.indices.cpu().int()
    return [(states[row, :len(s)], probs[row, :len(s)], top_ids[row, :len(s)]) for row, s in enumerate(sequences)]


def choose_vocab(labels: Sequence[torch.Tensor], size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The `size` most frequent labels (ties: lower id), the `always` ids (EOS) among them."""
    counts = Counter()
    for block in labels:
        counts.update(block.tolist())
    chosen = list(dict.fromkeys(always))[:size]
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def bigram_baseline(train_tokens, train_labels, test_tokens, test_labels, train_starts=None,
                    test_starts=None) -> tuple[float, float]:
    """Held-out agreement of two baselines: always the most frequent label; the most frequent label
    after the current token (a drafter that knows only the last token). Scored where the head is
    (`_examples`): the labels from each sequence's `starts` entry (its prompt's length) on."""
    counts, after = Counter(), {}
    for tokens, labels, start in zip(train_tokens, train_labels, train_starts or [1] * len(train_tokens)):
        start = max(start, 1)
        for token, label in zip(tokens[start:].tolist(), labels[start:].tolist()):
            counts[label] += 1
            after.setdefault(token, Counter())[label] += 1
    top = counts.most_common(1)[0][0]
    best = {token: c.most_common(1)[0][0] for token, c in after.items()}
    hits_top = hits_after = total = 0
    for tokens, labels, start in zip(test_tokens, test_labels, test_starts or [1] * len(test_tokens)):
        start = max(start, 1)
        for token, label in zip(tokens[start:].tolist(), labels[start:].tolist()):
            hits_top += label == top
            hits_after += best.get(token, top) == label
            total += 1
    return hits_top / max(total, 1), hits_after / max(total, 1)
