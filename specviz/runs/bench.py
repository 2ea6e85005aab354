"""The benchmark: specviz's speculative decoding against plain decoding and against transformers' own
assisted generation (`generate` with the same drafter), on the prompt set in
assets/bench_prompts.json (`catalog.load_bench_prompts`: five prompts in each of Spec-Bench's six
categories). The command line is `specviz.cli.bench`; `views.bench_table` renders its summary.

Method: one short warm-up of every method, then the methods alternate prompt by prompt so that a
change in the machine's load hits all of them alike, through the harness of a prompt-set comparison
(`runs.prompt_sets`). specviz's side is one race per prompt: plain and speculative decoding
interleaved event by event, exactly as `run` and the app race them;
each method's tokens/s is its tokens over the sum of its own event times (the whole run, prompt
prefill included). transformers' `generate` follows, timed as one call by the same `Clock`. Per
category, every column is the median over prompts of the per-prompt value (a speedup is the median
of per-prompt ratios, not a ratio of medians). Greedy only: the three methods must produce the same
tokens (exactly so in float32; bf16 flips near-ties).

Columns: accept = accepted / drafted tokens; tok/pass = tokens per target pass; c = draft time per
drafted token / target pass time; theory = (1 - a^(k+1)) / ((1 - a)(k c + 1)) at the measured a and
c (metrics.expected_speedup); pass cost = a verification pass's time / a plain step's time, which
the theory takes to be 1; theory at pass cost = theory / pass cost. A draft with another tokenizer
(drafted across tokenizers) adds draft tok/target tok: the draft model's own tokens run per target
token it proposed.

`tiny` as the target builds the tiny Llama pair in-process (`models.tiny`), so the bench runs with
no model files at all; its forwards are so cheap that it measures mostly per-token overhead.
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace

import torch
from transformers import PreTrainedModel

from ..catalog import BenchPrompt
from ..core.plain import batched_autoregressive_decode
from ..core.timing import Clock, collector_paused
from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..core.drafters import PromptLookupDrafter
from ..equal_work import ALONG_NEAR_TIES, work_rates
from ..metrics import median, ratio
from ..models import ModelPair
from ..models.host import host_description
from ..models.sources import TINY_TARGET
from ..settings import DraftSpec, RunSettings, parse_draft
from .prompt_sets import iter_prompt_set
from .result import Run
from .run import encode, execute

# Draft length per kind of drafter.
DEFAULT_K = {"ngram": 8, "ngram-tree": 8, "suffix": 8, "self": 4, "model": 4, "head": 2, "auto": 8}
WARM_UP_TOKENS = 16


def default_draft(target: str | None) -> str:
    """The tiny target drafts with its own 2-layer model; any other with prompt lookup."""
    return "tiny" if target == TINY_TARGET else "ngram"


def default_k(draft: str | None) -> int:
    return DEFAULT_K[parse_draft(draft).kind]


# ----------------------------------------------------------------------------- what is benchmarked

@dataclass(frozen=True)
class Setup:
    """A loaded pair and the validated settings it runs with (greedy; `k` is the draft length)."""
    settings: RunSettings
    pair: ModelPair
    transformers: bool = True       # False: transformers' assisted generation is not run (`--no-transformers`)

    @property
    def draft(self) -> DraftSpec:
        # Validated settings carry the parsed spec (returned as it is); settings built by hand, text.
        return parse_draft(self.settings.draft)

    @property
    def assistant(self) -> PreTrainedModel | None:
        """The draft model, for transformers' assistant_model= (None for ngram and self:L)."""
        return self.pair.draft.model if self.draft.kind == "model" else None

    @property
    def device(self) -> torch.device:
        return self.pair.device


@dataclass
class Timed:
    """One transformers `generate` call: the new tokens, its time and the target's passes."""
    tokens: list[int]
    seconds: float
    target_passes: int = 0          # target forwards, prefill included

    @property
    def tokens_per_s(self) -> float:
        return ratio(len(self.tokens), self.seconds)


# What transformers' assisted generation has no counterpart of: its columns stay empty for these.
NOT_IN_TRANSFORMERS = {"head": "none (transformers has no trained draft head)",
                       "auto": "none (transformers drafts with one drafter, not one chosen each cycle)"}


def transformers_settings(setup: Setup) -> tuple[dict, dict, str] | None:
    """(generate kwargs, settings to put on the assistant's generation_config, description) that
    give transformers the same drafter with a fixed draft length k; None where it has no such drafter."""
    k, draft = setup.settings.k, setup.draft
    if draft.kind in NOT_IN_TRANSFORMERS or not setup.transformers:
        return None
    if draft.kind in ("ngram", "ngram-tree", "suffix"):
        # transformers verifies chains only: a tree drafter is measured against its chain prompt lookup.
        # transformers' prompt lookup matches up to this many tokens (the n-gram drafters' own size;
        # suffix matches longer suffixes, which transformers cannot).
        ngram = getattr(setup.pair.draft, "max_ngram", PromptLookupDrafter().max_ngram)
        return ({"prompt_lookup_num_tokens": k, "max_matching_ngram_size": ngram}, {},
                f"prompt_lookup_num_tokens={k}, max_matching_ngram_size={ngram}"
                + (" (chain: transformers has no token trees)" if draft.kind != "ngram" else ""))
    # transformers 5 defaults to 20 assistant tokens cut short by a confidence threshold (0.4,
    # tuned as it runs); fix both to draft exactly k tokens, as specviz does.
    fixed = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
             "assistant_confidence_threshold": 0.0}
    described = f"num_assistant_tokens={k}, num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0"
    if setup.settings.branch > 1:
        described += " (chain: transformers has no token trees)"
    if draft.kind == "self":
        return {"assistant_early_exit": draft.layers}, fixed, f"assistant_early_exit={draft.layers}, {described}"
    if isinstance(setup.pair.draft, CrossTokenizerDrafter):
        # transformers' Universal Assisted Decoding: the same string-level re-tokenization.
        drafter = setup.pair.draft
        return ({"assistant_model": drafter.model, "tokenizer": drafter.target_tokenizer,
                 "assistant_tokenizer": drafter.draft_tokenizer}, fixed,
                f"assistant_model=<draft>, tokenizer=<target's>, assistant_tokenizer=<draft's>, {described}")
    return {"assistant_model": setup.assistant}, fixed, f"assistant_model=<draft>, {described}"


@contextlib.contextmanager
def generation_config_set(model: PreTrainedModel, values: dict) -> Iterator[None]:
    """Temporarily set attributes of `model.generation_config` (where transformers' candidate
    generators read the assistant's settings)."""
    config = model.generation_config
    saved = {name: getattr(config, name, None) for name in values}
    try:
        for name, value in values.items():
            setattr(config, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(config, name, value)


def run_transformers(setup: Setup, input_ids: torch.Tensor, clock: Callable[[], float],
                     max_new_tokens: int | None = None) -> Timed | None:
    """transformers' assisted generation, greedy, timed as one call (None where it has no such drafter)."""
    given = transformers_settings(setup)
    if given is None:
        return None
    kwargs, assistant_config, _ = given
    target = setup.pair.target
    assistant = setup.assistant if setup.assistant is not None else target
    eos = list(setup.pair.eos_token_ids) or None
    # Count the target's own passes. Early exit drafts with the target itself, its layer count
    # temporarily cut to L: those calls are drafts, not passes.
    base = getattr(target, target.base_model_prefix, target)
    layers, passes = base.config.num_hidden_layers, [0]

    def count(module, args):
        passes[0] += base.config.num_hidden_layers == layers

    handle = target.register_forward_pre_hook(count)
    try:
        with generation_config_set(assistant, assistant_config), torch.inference_mode(), collector_paused():
            start = clock()
            out = target.generate(input_ids, do_sample=False, num_beams=1,
                                  max_new_tokens=max_new_tokens or setup.settings.max_new_tokens,
                                  eos_token_id=eos, pad_token_id=(eos or [0])[0],
                                  attention_mask=torch.ones_like(input_ids), **kwargs)
            seconds = clock() - start
    finally:
        handle.remove()
    return Timed(out[0, input_ids.shape[1]:].tolist(), seconds, target_passes=passes[0])


# ----------------------------------------------------------------------------- one prompt, all prompts

def prompt_settings(setup: Setup, prompt: BenchPrompt) -> RunSettings:
    """The settings for one prompt: a prompt marked raw in the set is never wrapped in the template."""
    return replace(setup.settings, chat=setup.settings.chat and prompt.chat)


def bench_row(setup: Setup, prompt: BenchPrompt, runs: Sequence[Run], transformers: Sequence[Timed]) -> dict:
    """One JSON row from the repeated runs of one prompt: the counts of the first, medians of tokens/s."""
    run, hf = runs[0], transformers[0] if transformers else None
    loads = [r.host_load for r in runs if r.host_load is not None]
    stats, speed = run.stats, run.speed
    # Over the tokens both methods wrote (`equal_work.equal_work`): greedy outputs that part compare their
    # shared prefix, never a continuation only one side wrote.
    equal = [work_rates(r.compared) for r in runs]
    rates = {"plain": median([plain for _spec, plain in equal]),
             "specviz": median([spec for spec, _plain in equal]),
             "transformers": median([t.tokens_per_s for t in transformers]) if transformers else None}
    row = {
        "id": prompt.id, "category": prompt.category, "target": run.target_name, "draft": run.draft_name,
        "dtype": run.dtype, "k": setup.settings.k, "prompt_tokens": run.prompt_tokens, "new_tokens": stats.tokens,
        "acceptance_rate": stats.draft_acceptance_rate, "alpha": stats.alpha,
        # Tokens per target pass, every pass counted (Spec-Bench's "mean accepted tokens"), under the run
        # summary's name; vLLM's mean acceptance length counts only the passes that verified a draft.
        # (Files written between issue 44 and this name held the mean acceptance length as "tokens_per_pass".)
        "tokens_per_cycle": stats.tokens_per_cycle, "mean_acceptance_length": stats.mean_acceptance_length,
        "nodes_per_pass": stats.mean_nodes_per_pass,
        "target_passes": stats.cycles, "cycles_drafted": stats.cycles_drafted, "cycles_paused": stats.cycles_paused,
        "transformers_target_passes": hf.target_passes if hf else None,
        # Spec-Bench's "mean accepted tokens" for transformers: its new tokens per target pass.
        "transformers_tokens_per_pass": ratio(len(hf.tokens), hf.target_passes) if hf else None,
        # A hybrid drafter (`auto`): per drafter, its drafts and accepted tokens (metrics.per_drafter).
        "drafters": stats.drafters,
        "expected_tokens_per_pass": stats.expected_tokens_per_pass,
        "mean_drafted": ratio(stats.drafted, stats.cycles),
        "cost_ratio": stats.cost_ratio, "expected_speedup": stats.expected_speedup,
        "baseline_tokens_per_s": rates["plain"], "specviz_tokens_per_s": rates["specviz"],
        "transformers_tokens_per_s": rates["transformers"],
        "specviz_speedup": ratio(rates["specviz"], rates["plain"]),
        "transformers_speedup": ratio(rates["transformers"], rates["plain"]) if hf else None,
        "specviz_vs_transformers": ratio(rates["specviz"], rates["transformers"]) if hf else None,
        "identical_to_baseline": bool(run.identical),
        "compared_tokens": run.compared.tokens, "compared_basis": run.compared.basis,
        # Greedy outputs that parted, compared along the speculative text (`equal_work.ALONG_NEAR_TIES`): the
        # positions where plain decoding's own argmax was another token by a near-tie, and by how much.
        "near_ties": [list(tie) for tie in run.compared.near_ties],
        "first_divergence": run.divergence,
        # transformers wrote as many tokens as were compared: identical to plain decoding's over those.
        "transformers_identical_to_baseline": hf.tokens == run.baseline_tokens[:run.compared.tokens] if hf else None,
        "repeats": len(runs),
        # Repeated work: how many earlier turns were decoded first (untimed) with the same drafter,
        # and how many accepted tokens only those turns' text proposed (suffix decoding).
        "earlier_turns": len(prompt.earlier),
        "accepted_from_earlier": stats.accepted_from_earlier,
        # Drafting across tokenizers (None otherwise): the draft model's own tokens run, and per
        # target token proposed (what re-tokenization costs the draft).
        "cross_tokenizer": stats.draft_model_tokens is not None,
        "draft_model_tokens": stats.draft_model_tokens,
        "draft_tokens_per_target_token": stats.draft_tokens_per_target_token,
        # The theory prices a verification pass like one plain step; this is what it really cost
        # (medians, prefill left out), and the theory at that price: what is left between it and
        # the measured speedup is the engine's own time and how far acceptance is from the
        # theory's independent-tokens model.
        "verify_pass_cost": speed.pass_cost if speed is not None and speed.pass_cost else None,
        "expected_speedup_at_pass_cost": run.theory_at_pass_cost,
        # How busy the host was (models.host): a busy host inflates every tokens/s of the row, the
        # interleaved ones alike; the worst of the repeats.
        "busy_host_repeats": sum(load.busy for load in loads),
        "host_load_average": max((load.load_average for load in loads if load.load_average is not None), default=None),
        "host_steal_share": max((load.steal_share for load in loads if load.steal_share is not None), default=None),
        # The cost tables the policy decided from (fixed for the process once measured; a row after a
        # longer prompt than any before it adds that context's): which widths it priced how, and which
        # row counts the process's products were oriented for (models.cpu_linear).
        "decided_on": run.decided_on,
    }
    row["speedup_vs_theory"] = ratio(row["specviz_speedup"], row["expected_speedup"])
    return row


def run_bench(setup: Setup, prompts: Sequence[BenchPrompt], *, repeats: int = 1, warmup: bool = True,
              progress: Callable[[str], None] | None = None) -> list[dict]:
    """Rows for `prompts`, `repeats` rounds, through `runs.prompt_sets` (the harness of a prompt-set
    comparison): per prompt, specviz's race (plain and speculative), then transformers.
    `setup.settings` must have passed `settings.validate` (greedy)."""
    pair, clock = setup.pair, Clock(setup.device)
    encoded = [encode(prompt_settings(setup, p), p.prompt, pair) for p in prompts]
    if warmup and prompts:   # one-time costs (allocator, lazy init, kernel choice) are paid here
        short = replace(prompt_settings(setup, prompts[0]), max_new_tokens=min(setup.settings.max_new_tokens,
                                                                             WARM_UP_TOKENS))
        execute(short, prompts[0].prompt, pair, baseline=True, warm_up=False)
        run_transformers(setup, encoded[0], clock, short.max_new_tokens)   # nothing where it has no such drafter
    runs: list[list[Run]] = [[] for _ in prompts]
    hf: list[list[Timed]] = [[] for _ in prompts]

    def with_transformers(_config: int, i: int, round_: int, run: Run) -> None:
        # The same harness as a prompt-set comparison; transformers runs right after each prompt's race,
        # for as many new tokens as plain and specviz are rated over (`equal_work.equal_work`: where
        # greedy outputs part, their shared prefix), so that the three rates are of the same work.
        runs[i].append(run)
        timed = run_transformers(setup, encoded[i], clock, max(1, run.compared.tokens))
        if timed is not None:
            hf[i].append(timed)
        if progress:
            theirs = f"  transformers {timed.tokens_per_s:6.1f}" if timed is not None else ""
            progress(f"[{round_ + 1}/{repeats}] {prompts[i].id:<20} plain {run.plain.tokens_per_second:6.1f}  "
                     f"specviz {run.stats.tokens_per_second:6.1f}{theirs} tokens/s")

    for _ in iter_prompt_set([setup.settings], prompts, repeats=repeats, loader=lambda _settings, _progress: pair,
                             warm_up=False, after_run=with_transformers):
        pass
    return [bench_row(setup, prompt, r, t) for prompt, r, t in zip(prompts, runs, hf)]


# ----------------------------------------------------------------------------- summaries

SUMMARY_KEYS = ("acceptance_rate", "tokens_per_cycle", "mean_acceptance_length", "nodes_per_pass", "cost_ratio",
                "baseline_tokens_per_s", "specviz_tokens_per_s",
                "transformers_tokens_per_s", "specviz_speedup", "transformers_speedup", "specviz_vs_transformers",
                "expected_speedup", "speedup_vs_theory", "expected_tokens_per_pass", "verify_pass_cost",
                "expected_speedup_at_pass_cost", "draft_tokens_per_target_token", "transformers_tokens_per_pass")


def summarize_rows(rows: Sequence[dict]) -> list[dict]:
    """Per (target, draft, category) and per (target, draft) overall: medians over prompts, and
    how many outputs were identical to plain decoding."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        groups.setdefault((row["target"], row["draft"], row["category"]), []).append(row)
    for row in rows:
        groups.setdefault((row["target"], row["draft"], "overall"), []).append(row)
    summary = []
    for (target, draft, category), members in groups.items():
        entry = {"target": target, "draft": draft, "category": category, "prompts": len(members),
                 "k": members[0]["k"], "dtype": members[0]["dtype"]}
        for key in SUMMARY_KEYS:
            values = [m[key] for m in members if m.get(key) is not None]
            entry[key] = median(values) if values else None
        entry["cross_tokenizer"] = any(m.get("cross_tokenizer") for m in members)
        entry["identical"] = sum(m["identical_to_baseline"] for m in members)
        entry["along_near_ties"] = sum(m.get("compared_basis") == ALONG_NEAR_TIES for m in members)
        told = [m["transformers_identical_to_baseline"] for m in members
                if m["transformers_identical_to_baseline"] is not None]
        entry["transformers_identical"] = sum(told) if told else None
        summary.append(entry)
    return summary


def describe(setup: Setup) -> dict:
    import transformers

    pair, settings = setup.pair, setup.settings
    return {"target": pair.target_name, "draft": pair.draft_name, "device": str(pair.device),
            "dtype": str(pair.dtype).removeprefix("torch."), "k": settings.k,
            "draft_policy": "dynamic k" if settings.dynamic_k else "fixed k" if settings.fixed_k else "cost-aware",
            "max_new_tokens": settings.max_new_tokens, "hardware": host_description(pair.device),
            "torch": torch.__version__, "transformers": transformers.__version__, "clock": Clock(pair.device).name,
            "transformers_settings": _transformers_described(setup), "eos_token_ids": list(pair.eos_token_ids)}


def _transformers_described(setup: Setup) -> str:
    given = transformers_settings(setup)
    if given is not None:
        return given[2]
    return NOT_IN_TRANSFORMERS.get(setup.draft.kind, "not run (--no-transformers)")


# ----------------------------------------------------------------------------- the baseline's strength

def plain_against_generate(pair: ModelPair, ids: Sequence[Sequence[int]], max_new_tokens: int, *,
                           repeats: int = 3) -> dict:
    """Batched plain decoding's throughput against transformers' batched `generate` on the same
    prompts (greedy, left padding, the pair's dtype and torch's current threads, no EOS so that every
    row writes `max_new_tokens` in both), alternated `repeats` times after one untimed round each,
    timed by the same clock. Returns the median ratio (ours / generate's tokens per second) and both
    rates of each round."""
    target = pair.target
    clock = Clock(target.device)
    width = max(len(p) for p in ids)
    input_ids = torch.zeros(len(ids), width, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for row, prompt in enumerate(ids):
        input_ids[row, width - len(prompt):] = torch.tensor(list(prompt))
        attention[row, width - len(prompt):] = 1
    input_ids, attention = input_ids.to(target.device), attention.to(target.device)

    def ours() -> float:
        start = clock()
        tokens = sum(len(e.tokens) for e in batched_autoregressive_decode(target, ids, max_new_tokens, eos_token_id=[]))
        return ratio(tokens, clock() - start)

    def theirs() -> float:
        start = clock()
        # No EOS in the generation config either: no row stops early, no logits processor runs.
        with torch.inference_mode(), generation_config_set(target, {"eos_token_id": None}):
            out = target.generate(input_ids, attention_mask=attention, max_new_tokens=max_new_tokens,
                                  do_sample=False, pad_token_id=0)
        return ratio((out.shape[1] - width) * len(ids), clock() - start)

    ours(), theirs()
    rounds = [(ours(), theirs()) for _ in range(repeats)]
    return {"ratio": statistics.median(a / b for a, b in rounds),
            "rounds": [{"ours_tokens_per_s": a, "generate_tokens_per_s": b} for a, b in rounds],
            "clock": clock.name, "batch": len(ids), "max_new_tokens": max_new_tokens}
