"""Where a trained head's acceptance is lost: in the loop, or in what it learned. On chat prompts outside
its training set (scripts/bench_head.py's), greedy, fp32, k = 1 (each cycle drafts one token, so its
acceptance is the first draft's):

    HF_HUB_OFFLINE=1 python scripts/head_agreement.py [--head head | head:DIR] [--max-new-tokens 64]

prints the loop's acceptance; the head's agreement with the target at the same positions, read the
way training reads a sequence (the finished text through the target once, every position's first
draft at once: core.head.teacher_forced_first_drafts); and the agreement over every position of the
replies. The first two are equal when drafting reads what training read; the third, set against the
held-out agreement training printed, shows how far the chat prompts are from the training text.
`--held-out FILE` (repeatable) adds the same agreement over the replies to the prompts of FILE that
training holds out when it trains on FILE (its first 10% in training's shuffled order), in bf16 as
training reads them: each prompt source's agreement beside the chat prompts'."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

from bench_head import chat_prompts  # noqa: E402

from specviz.catalog import MAX_TRAINING_PROMPTS, read_prompt_file  # noqa: E402
from specviz.core.decoding import speculative_decode  # noqa: E402
from specviz.core.plain import batched_autoregressive_decode  # noqa: E402
from specviz.core.head import teacher_forced_first_drafts  # noqa: E402
from specviz.core.ragged_cache import hidden_features, hidden_request  # noqa: E402
from specviz.models.host import host_description  # noqa: E402
from specviz.runs.run import encode, load  # noqa: E402
from specviz.runs.head_data import held_out_prompts  # noqa: E402
from specviz.runs.train_draft import TrainOptions  # noqa: E402
from specviz.settings import LOCAL, RunSettings, validate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", default="head")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--held-out", action="append", default=[], metavar="FILE",
                        help="a training prompt file: also the agreement on the replies to its held-out prompts")
    parser.add_argument("--limit", type=int, default=32, help="held-out prompts per file (default 32)")
    args = parser.parse_args()
    if args.held_out:
        bf16 = validate(RunSettings(draft=args.head, dtype="bfloat16", max_new_tokens=TrainOptions.max_new_tokens),
                        LOCAL)
        pair16 = load(bf16)
        for name in args.held_out:
            print(held_out_agreement(bf16, pair16, name, args.limit), flush=True)
    settings = validate(RunSettings(draft=args.head, dtype="float32", max_new_tokens=args.max_new_tokens), LOCAL)
    pair = load(settings)
    drafter = pair.draft
    loop = [0, 0]           # accepted, drafted
    same = [0, 0]           # the loop's draft equal to the teacher-forced one, compared
    starts = [0, 0]         # teacher-forced agreement at the cycles' positions: agreed, compared
    replies = [0, 0]        # teacher-forced agreement over every reply position
    for prompt in chat_prompts():
        ids = encode(settings, prompt, pair)
        emitted, drafts = [], {}
        for cycle in speculative_decode(pair.target, drafter, ids, max_new_tokens=args.max_new_tokens, k=1,
                                        eos_token_id=pair.eos_token_ids):
            if len(cycle.drafted):
                drafts[ids.shape[1] + len(emitted)] = int(cycle.drafted[0])
                loop[0] += cycle.num_accepted
                loop[1] += 1
            emitted += list(cycle.emitted)
        sequence = torch.cat([ids[0], torch.tensor(emitted, dtype=ids.dtype)])
        first = first_drafts(pair, sequence)
        # Token j is guessed by first[j - 2]; scored as training scores its held-out agreement: the replies'
        # tokens after the first (the first is guessed from the prompt's last token, as no cycle drafts it).
        for j in range(ids.shape[1] + 1, len(sequence)):
            agreed = int(first[j - 2]) == int(sequence[j])
            replies[0] += agreed
            replies[1] += 1
            if j in drafts:
                starts[0] += agreed
                starts[1] += 1
                same[0] += drafts[j] == int(first[j - 2])
                same[1] += 1
    print(f"{pair.draft_name} on {pair.target_name}, {len(chat_prompts())} chat prompts, {args.max_new_tokens} new "
          f"tokens, greedy, fp32, k = 1; {host_description('cpu')}")
    print(f"accepted in the loop:                          {loop[0]} of {loop[1]} = {loop[0] / loop[1]:.1%}")
    print(f"agreement read as training reads, same places: {starts[0]} of {starts[1]} = {starts[0] / starts[1]:.1%}"
          f" (the loop's draft is that one at {same[0]} of {same[1]})")
    print(f"agreement over every reply position:           {replies[0]} of {replies[1]} = "
          f"{replies[0] / replies[1]:.1%}")
    return 0


def first_drafts(pair, sequence: torch.Tensor) -> torch.Tensor:
    """Every position's first draft of the finished `sequence`, read as training reads it: token j is
    guessed by the result's [j - 2]."""
    layers = pair.draft.hidden_layers
    with torch.no_grad():
        out = pair.target(sequence[None].to(pair.target.device), **hidden_request(layers))
    return teacher_forced_first_drafts(pair.draft.head, hidden_features(out, layers)[0], sequence).cpu()


def held_out_agreement(settings, pair, file: str, limit: int) -> str:
    """The head's teacher-forced agreement over the replies (192 new tokens at most, as training writes
    them) to the first `limit` prompts of `file` that training on `file` holds out; `pair` loaded in bf16,
    as training reads them."""
    prompts = [p.prompt for p in read_prompt_file(Path(file), MAX_TRAINING_PROMPTS)]
    chosen = held_out_prompts(prompts)[:limit]
    encoded = [encode(settings, prompt, pair)[0].tolist() for prompt in chosen]
    replies = [[] for _ in encoded]
    for event in batched_autoregressive_decode(pair.target, encoded, max_new_tokens=TrainOptions.max_new_tokens,
                                               eos_token_id=list(pair.eos_token_ids)):
        for row, token in zip(event.requests, event.tokens):
            replies[row].append(token)
    agreed = compared = 0
    for prompt, reply in zip(encoded, replies):
        sequence = torch.tensor(prompt + reply)
        first = first_drafts(pair, sequence)
        for j in range(len(prompt) + 1, len(sequence)):
            agreed += int(first[j - 2]) == int(sequence[j])
            compared += 1
    return (f"{pair.draft_name}: held-out prompts of {file} ({len(chosen)}), bf16, teacher-forced agreement over "
            f"the replies: {agreed} of {compared} = {agreed / max(compared, 1):.1%}")


if __name__ == "__main__":
    raise SystemExit(main())
