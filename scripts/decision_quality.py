"""Which drafter decides best, apart from the clock's noise (`python scripts/decision_quality.py`).

Runs every drafter on every prompt as `bench` does (plain decoding too, for the measured speedup), then
prices each run's cycles with one fixed table: each pass at this process's calibrated cost for its
width after its context (core.pass_costs, the table the cost-aware policy decided with), plus the drafting seconds the
cycle measured, over a plain step. "priced" is tokens over that priced time: the same cycles give the
same figure whatever the host did meanwhile, so a 2% difference between two drafters' decisions is
resolved, where the measured speedups of three prompts per category move by up to 10% between
identical runs. It is not a speedup (it leaves out what a pass costs beyond its table, and the loop's
own time); the measured one is printed beside it. "pass-only" leaves drafting out: what the choices
would give if drafting cost nothing. `--without-head` adds `auto-no-head` (auto's drafters less its
head), to see what the head adds; `--float-head` adds `auto-float-head` (auto with its head drafting in
float where it drafts in int8 on a CPU, `core.eagle3.int8_copy`), to see what int8 drafting does;
`--one-branch` adds `auto-one-branch` (auto never holding two drafters' branches in one tree,
`HybridDrafter(merge=False)`), to see what those trees do; `--by-gain` adds `auto-by-gain` (auto choosing
between its two copies by their expected gains every cycle, `HybridDrafter(prefer=None)`, instead of
suffix decoding unless prompt lookup has clearly paid more, core.copy_record); `--one-copy` adds
`auto-one-copy` (auto never drafting one tree of both copies, `HybridDrafter(both=False)`); `--no-window` adds
`auto-no-window` (auto whose head reads a request's whole prompt when it first drafts, `HeadDrafter(window=None)`,
where it reads the last `core.head.WINDOW` positions).

Defaults: the built-in model, the bundled benchmark prompts (not Spec-Bench: nothing is chosen on
Spec-Bench; `--prompts FILE` takes a set of one's own, such as `scripts/long_prompts.py`'s), k = 8, 96 new
tokens, one torch thread. Prints a table per category; `--json FILE` writes every run's figures."""

from __future__ import annotations

import argparse
import copy
import json
import sys
from collections import Counter, defaultdict
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import BENCH_PROMPTS_FILE, load_bench_prompts, load_spec_bench  # noqa: E402 - after the sys.path insert
from specviz.core.hybrid import HybridDrafter  # noqa: E402
from specviz.models.head_files import spec_location  # noqa: E402
from specviz.models.heads import load_head  # noqa: E402
from specviz.runs import last  # noqa: E402
from specviz.runs.prompt_sets import iter_prompt_set  # noqa: E402
from specviz.runs.cost_tables import costs_for  # noqa: E402
from specviz.runs.run import load  # noqa: E402
from specviz.settings import LOCAL, RunSettings, validate  # noqa: E402

WITHOUT_HEAD = "auto-no-head"
FLOAT_HEAD = "auto-float-head"
ONE_BRANCH = "auto-one-branch"
BY_GAIN = "auto-by-gain"
ONE_COPY = "auto-one-copy"
NO_WINDOW = "auto-no-window"


def priced(cycles, table, widest: int, prompt_tokens: int) -> dict:
    """One run's cycles priced by a fixed table (`PassCosts`): each pass over w drafted tokens at its
    cost in plain steps after the context it followed (the prompt's `prompt_tokens` and the tokens
    emitted before it), drafting over the table's plain step. The first pass (which also read the
    prompt) is priced as the others are, so that every drafter's run of a prompt is priced over the
    same tokens."""
    steps, context = 0.0, prompt_tokens
    for c in cycles:
        steps += table.relative(widest, context)[len(c.drafted)]
        context += len(c.emitted)
    return dict(tokens=sum(len(c.emitted) for c in cycles), passes=len(cycles), pass_steps=steps,
                draft_steps=sum(c.draft_seconds for c in cycles) / table.step,
                chosen=dict(Counter(str(c.drafter) for c in cycles if c.drafted)))


def summarize(rows: list[dict], names: list[str]) -> dict[str, dict[str, dict]]:
    """Per category (and "overall"), per drafter: priced, pass-only, drafting per cycle, tokens per pass."""
    sums: dict = defaultdict(lambda: defaultdict(lambda: Counter()))
    for row in rows:
        for key in (row["category"], "overall"):
            total = sums[key][row["config"]]
            for field in ("tokens", "passes", "pass_steps", "draft_steps"):
                total[field] += row[field]
    out = {}
    for key, by_config in sums.items():
        out[key] = {name: dict(priced=t["tokens"] / (t["pass_steps"] + t["draft_steps"]),
                               pass_only=t["tokens"] / t["pass_steps"], drafting=t["draft_steps"] / t["passes"],
                               tokens_per_pass=t["tokens"] / t["passes"])
                    for name in names if (t := by_config.get(name))}
    return out


def main(argv=None, loader=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", default="ngram,suffix,auto", help="drafters, comma-separated")
    parser.add_argument("--without-head", action="store_true", help=f"add {WITHOUT_HEAD}")
    parser.add_argument("--float-head", action="store_true", help=f"add {FLOAT_HEAD}")
    parser.add_argument("--one-branch", action="store_true", help=f"add {ONE_BRANCH}")
    parser.add_argument("--by-gain", action="store_true", help=f"add {BY_GAIN}")
    parser.add_argument("--one-copy", action="store_true", help=f"add {ONE_COPY}")
    parser.add_argument("--no-window", action="store_true", help=f"add {NO_WINDOW}")
    parser.add_argument("--target", default=None)
    parser.add_argument("--prompts", default="bundled",
                        help="bundled, spec-bench, or a JSON file in the bundled set's format (every category in it)")
    parser.add_argument("--limit", type=int, default=None, help="prompts per category")
    parser.add_argument("--sample-seed", type=int, default=None)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--k", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_grad_enabled(False)
    if args.prompts == "spec-bench":
        prompts = load_spec_bench(limit=args.limit, sample_seed=args.sample_seed)
    else:
        path = BENCH_PROMPTS_FILE if args.prompts == "bundled" else args.prompts
        prompts = load_bench_prompts(path, categories="all", limit=args.limit)
    names = (args.draft.split(",") + ([WITHOUT_HEAD] if args.without_head else [])
             + ([FLOAT_HEAD] if args.float_head else []) + ([ONE_BRANCH] if args.one_branch else [])
             + ([BY_GAIN] if args.by_gain else []) + ([ONE_COPY] if args.one_copy else [])
             + ([NO_WINDOW] if args.no_window else []))
    base = validate(RunSettings(target=args.target, k=args.k, max_new_tokens=args.max_new_tokens,
                                dtype=args.dtype), LOCAL)
    variants = (WITHOUT_HEAD, FLOAT_HEAD, ONE_BRANCH, BY_GAIN, ONE_COPY, NO_WINDOW)
    configs = [validate(replace(base, draft="auto" if name in variants else name), LOCAL) for name in names]
    pairs = []

    def like_auto(pair, components=None, **options) -> HybridDrafter:
        # The pair's `auto` with other drafters or options; its name, trees and preference kept unless given.
        options = dict(name=pair.draft.name, merge=pair.draft.merges, prefer=pair.draft.prefer,
                       both=pair.draft.both) | options
        return HybridDrafter(pair.draft.components if components is None else components, **options)

    def load_one(settings, progress=None):
        # Pairs load in the configurations' order: auto-no-head is auto's pair with its head taken out.
        pair = (loader or load)(settings, progress)
        if names[len(pairs)] == WITHOUT_HEAD:
            kept = [c for c in pair.draft.components if not c.hidden_layers]
            pair = replace(pair, draft=like_auto(pair, kept), draft_name=WITHOUT_HEAD)
        elif names[len(pairs)] == FLOAT_HEAD:
            # Its own name: the process's drafting costs are kept per drafter name (the int8 head's apart).
            head = next((c for c in pair.draft.components if c.hidden_layers), None)
            if head is None:
                raise SystemExit(f"--float-head: auto has no head for {pair.target_name}")
            floating = load_head(spec_location(head.name, pair.target_name), pair.target, int8=False,
                                 target_name=pair.target_name, name="head (float)")
            kept = [floating if c is head else c for c in pair.draft.components]
            pair = replace(pair, draft=like_auto(pair, kept), draft_name=FLOAT_HEAD)
        elif names[len(pairs)] == ONE_BRANCH:
            pair = replace(pair, draft=like_auto(pair, merge=False), draft_name=ONE_BRANCH)
        elif names[len(pairs)] == BY_GAIN:
            pair = replace(pair, draft=like_auto(pair, prefer=None), draft_name=BY_GAIN)
        elif names[len(pairs)] == ONE_COPY:
            pair = replace(pair, draft=like_auto(pair, both=False), draft_name=ONE_COPY)
        elif names[len(pairs)] == NO_WINDOW:
            # Its own name, as the float head's: its drafting after a long context costs what it costs.
            head = next((c for c in pair.draft.components if c.hidden_layers), None)
            if head is None:
                raise SystemExit(f"--no-window: auto has no head for {pair.target_name}")
            whole = copy.copy(head)
            whole.window, whole.name, whole.states = None, "head (no window)", []
            kept = [whole if c is head else c for c in pair.draft.components]
            pair = replace(pair, draft=like_auto(pair, kept), draft_name=NO_WINDOW)
        pairs.append(pair)
        return pair

    runs = {}
    result = last(iter_prompt_set(configs, prompts, loader=load_one,
                                  after_run=lambda c, p, _round, run: runs.__setitem__((c, p), run)))
    table = costs_for(pairs[0])[0][torch.get_num_threads()]
    widest = max(len(c.drafted) for run in runs.values() for c in run.cycles) + 1
    relative = table.relative(widest)
    by_context = {c: table.at(c).relative(widest) for c in table.contexts}
    rows = []
    for (c, p), run in sorted(runs.items()):
        rows.append(dict(config=names[c], prompt=prompts[p].id, category=prompts[p].category,
                         measured=result.per_prompt(c)[p], **priced(run.cycles, table, widest, run.prompt_tokens)))
    summary = summarize(rows, names)
    for context, costs in by_context.items():
        print(f"pass costs after {context} tokens (plain steps, widths 0-8): {' '.join(f'{x:.2f}' for x in costs[:9])}"
              + (f"; a plain step {table.step * 1000:.1f} ms" if context == table.context else ""))
    for key in sorted(summary, key=lambda k: (k == "overall", k)):
        cells = summary[key]
        best_single = max((v["priced"] for n, v in cells.items() if not n.startswith("auto")), default=None)
        parts = []
        for name, v in cells.items():
            versus = f", {v['priced'] / best_single - 1:+.1%} vs best single" \
                if best_single and name.startswith("auto") else ""
            parts.append(f"{name} {v['priced']:.3f} (pass-only {v['pass_only']:.3f}, drafting "
                         f"{v['drafting']:.3f}/pass, {v['tokens_per_pass']:.2f} tok/pass{versus})")
        print(f"{key}: " + "; ".join(parts))
    for c, name in enumerate(names):
        print(f"{name}: measured median speedup {result.summary(c).speedup_median:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(rows=rows, summary=summary, pass_costs=relative,
                                                   pass_costs_by_context=by_context), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
