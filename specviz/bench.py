"""`python -m specviz bench`: specviz's speculative decoding against plain decoding and against
transformers' own assisted generation (`generate` with the same drafter), on a prompt set shipped
in assets/bench_prompts.json (five prompts in each of Spec-Bench's six categories).

Method: one short warm-up of every method, then the methods alternate prompt by prompt (plain,
specviz, transformers, plain, specviz, ...) so that a change in the machine's load hits all three
alike; each method's tokens/s is its new tokens over the wall time of the whole call, prompt
prefill included. Per category, every column is the median over prompts of the per-prompt value
(a speedup is the median of per-prompt ratios, not a ratio of medians). Greedy only: the three
methods must produce the same tokens (exactly so in float32; bf16 flips near-ties).

Columns: accept = accepted / drafted tokens; tok/pass = tokens per target pass; c = draft time per
drafted token / target pass time; theory = (1 - a^(k+1)) / ((1 - a)(k c + 1)) at the measured a and
c (metrics.expected_speedup); pass cost = a verification pass's time / a plain step's time, which
the theory takes to be 1; theory at pass cost = theory / pass cost.

`--target tiny` builds a tiny Llama pair in-process (random weights, a byte-level "tokenizer"), so
the bench runs with no model files at all; its forwards are so cheap that it measures mostly the
per-token overhead of the two engines.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from .decoding import Clock, autoregressive_decode, speculative_decode
from .drafters import Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model
from .metrics import first_divergence, summarize

PROMPTS_FILE = Path(__file__).resolve().parent.parent / "assets" / "bench_prompts.json"
DEFAULT_K = {"ngram": 8, "self": 4, "model": 4}   # draft length per kind of drafter
NGRAM_SIZE = 3                                     # max_matching_ngram_size, as PromptLookupDrafter's default


class BenchError(Exception):
    """The bench could not run; the message is meant for the user."""


# ----------------------------------------------------------------------------- prompts

@dataclass(frozen=True)
class BenchPrompt:
    id: str
    category: str
    prompt: str
    chat: bool = True


def load_prompts(path: Path | str = PROMPTS_FILE, categories: Sequence[str] | None = None,
                 limit: int | None = None) -> list[BenchPrompt]:
    """The prompts of `categories` (all when None), in file order; at most `limit` per category."""
    data = json.loads(Path(path).read_text())
    known = data["categories"]
    wanted = list(known) if not categories else list(categories)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise BenchError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {', '.join(unknown)}: "
                         f"choose from {', '.join(known)}")
    prompts, taken = [], dict.fromkeys(wanted, 0)
    for item in data["prompts"]:
        if item["category"] in taken and (limit is None or taken[item["category"]] < limit):
            prompts.append(BenchPrompt(item["id"], item["category"], item["prompt"], item.get("chat", True)))
            taken[item["category"]] += 1
    return prompts


# ----------------------------------------------------------------------------- what is benchmarked

@dataclass
class Setup:
    """A target, a drafter, and how transformers' `generate` gets the same drafter."""

    target: PreTrainedModel
    drafter: Drafter
    draft_kind: str                       # "ngram", "self" or "model"
    encode: Callable[[str, bool], torch.Tensor]
    eos_token_ids: list[int]
    target_name: str
    draft_name: str
    dtype: torch.dtype
    assistant: PreTrainedModel | None = None   # a draft model, for assistant_model=
    early_exit: int | None = None              # L of self:L, for assistant_early_exit=

    @property
    def device(self) -> torch.device:
        return self.target.device


def load_setup(target: str | None, draft: str | None, *, device: str = "auto", dtype: str = "auto",
               chat: bool = True) -> Setup:
    """A benchmark setup from command-line strings: `tiny` builds the in-process pair, anything
    else goes through `models.load_pair` (the built-in default when `target` is None)."""
    if target == "tiny":
        return tiny_setup(draft or "tiny", device=device, dtype=dtype)
    from .models import ModelLoadError, encode_prompt, load_pair

    try:
        pair = load_pair(target, draft, device=device, dtype=dtype)
    except ModelLoadError as error:
        raise BenchError(str(error)) from None
    kind, layers = draft_kind(pair.draft_name if draft else "ngram")
    assistant = pair.draft.model if kind == "model" else None

    def encode(prompt: str, use_chat: bool) -> torch.Tensor:
        return encode_prompt(pair.tokenizer, prompt, chat=use_chat and chat)

    return Setup(pair.target, pair.draft, kind, encode, list(pair.eos_token_ids), pair.target_name, pair.draft_name,
                 pair.dtype, assistant=assistant, early_exit=layers)


def draft_kind(spec: str) -> tuple[str, int | None]:
    text = spec.strip().lower()
    if text == "ngram":
        return "ngram", None
    match = re.fullmatch(r"self:(\d+)", text)
    if match:
        return "self", int(match.group(1))
    return "model", None


# ----------------------------------------------------------------------------- the tiny pair

TINY_VOCAB = 384       # bytes 0-255 plus unused ids
TINY_DRAFT_LAYERS = 2


def tiny_models(seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                layers: int = 8, hidden: int = 128) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A random-weight Llama target and a 2-layer draft that copies its embedding, first two layers,
    final norm and LM head. The target's later layers are damped (their output projections scaled
    by 0.03) so that they nudge the residual stream rather than overwrite it, the way trained deep
    layers often do; the draft then agrees with the target on most tokens (~80% accepted)."""
    torch.manual_seed(seed)
    # A large initializer_range spreads the logits, so that greedy argmax is not decided by float
    # round-off between one-token and multi-token forwards.
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, initializer_range=0.3, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in target.model.layers[TINY_DRAFT_LAYERS:]:
            layer.self_attn.o_proj.weight.mul_(0.03)
            layer.mlp.down_proj.weight.mul_(0.03)
    draft_config = LlamaConfig(**config.to_dict())
    draft_config.num_hidden_layers = TINY_DRAFT_LAYERS
    draft = LlamaForCausalLM(draft_config).eval()
    draft.load_state_dict(target.state_dict(), strict=False)   # the layers it lacks are skipped
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target.to(device=device, dtype=dtype), draft.to(device=device, dtype=dtype)


def encode_bytes(prompt: str, chat: bool = True) -> torch.Tensor:
    """The tiny pair's tokenizer: UTF-8 bytes, in a minimal chat frame."""
    text = f"<user>\n{prompt}\n<assistant>\n" if chat else prompt
    return torch.tensor([list(text.encode())], dtype=torch.long)


def tiny_setup(draft: str = "tiny", *, device: str = "auto", dtype: str = "auto") -> Setup:
    from .models import resolve_device

    resolved = resolve_device(device)
    torch_dtype = torch.float32 if dtype == "auto" else _dtype(dtype)
    target, small = tiny_models(dtype=torch_dtype, device=resolved)
    text = draft.strip().lower()
    if text in ("tiny", "model"):
        return Setup(target, DraftModelDrafter(small, name="tiny-draft"), "model", encode_bytes, [], "tiny-llama",
                     "tiny-draft", torch_dtype, assistant=small)
    kind, layers = draft_kind(text)
    if kind == "ngram":
        return Setup(target, PromptLookupDrafter(NGRAM_SIZE), "ngram", encode_bytes, [], "tiny-llama", "ngram",
                     torch_dtype)
    if kind == "self":
        try:
            view = early_exit_model(target, layers)
        except ValueError as error:
            raise BenchError(f"draft {draft!r}: {error}") from None
        return Setup(target, DraftModelDrafter(view, name=text), "self", encode_bytes, [], "tiny-llama", text,
                     torch_dtype, early_exit=layers)
    raise BenchError(f"draft {draft!r} for the tiny target: use 'tiny' (its 2-layer draft model), 'ngram' or 'self:L'")


def _dtype(name: str) -> torch.dtype:
    from .models import DTYPES

    if name.lower() not in DTYPES:
        raise BenchError(f"unknown dtype {name!r}: use auto, float32, bfloat16 or float16")
    return DTYPES[name.lower()]


# ----------------------------------------------------------------------------- the three methods

@dataclass
class Timed:
    tokens: list[int]
    seconds: float
    cycles: list = field(default_factory=list)   # specviz only
    target_passes: int = 0                        # target forwards, prefill included (speculative methods)
    step_seconds: list[float] = field(default_factory=list)   # plain only: each step's time

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds else 0.0


def run_plain(setup: Setup, input_ids: torch.Tensor, max_new_tokens: int, clock: Callable[[], float]) -> Timed:
    start = clock()
    steps = list(autoregressive_decode(setup.target, input_ids, max_new_tokens, eos_token_id=setup.eos_token_ids))
    seconds = clock() - start
    return Timed([s.token for s in steps], seconds, step_seconds=[s.seconds for s in steps])


def run_specviz(setup: Setup, input_ids: torch.Tensor, max_new_tokens: int, k: int,
                clock: Callable[[], float]) -> Timed:
    start = clock()
    cycles = list(speculative_decode(setup.target, setup.drafter, input_ids, max_new_tokens, k=k,
                                     eos_token_id=setup.eos_token_ids))
    seconds = clock() - start
    return Timed([t for c in cycles for t in c.emitted], seconds, cycles, len(cycles))


def transformers_settings(setup: Setup, k: int) -> tuple[dict, dict, str]:
    """(generate kwargs, settings to put on the assistant's generation_config, description) that
    give transformers the same drafter with a fixed draft length k."""
    if setup.draft_kind == "ngram":
        return ({"prompt_lookup_num_tokens": k, "max_matching_ngram_size": NGRAM_SIZE}, {},
                f"prompt_lookup_num_tokens={k}, max_matching_ngram_size={NGRAM_SIZE}")
    # transformers 5 defaults to 20 assistant tokens cut short by a confidence threshold (0.4,
    # tuned as it runs); fix both to draft exactly k tokens, as specviz does.
    fixed = {"num_assistant_tokens": k, "num_assistant_tokens_schedule": "constant",
             "assistant_confidence_threshold": 0.0}
    described = f"num_assistant_tokens={k}, num_assistant_tokens_schedule='constant', assistant_confidence_threshold=0"
    if setup.draft_kind == "self":
        return {"assistant_early_exit": setup.early_exit}, fixed, f"assistant_early_exit={setup.early_exit}, {described}"
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


def run_transformers(setup: Setup, input_ids: torch.Tensor, max_new_tokens: int, k: int,
                     clock: Callable[[], float]) -> Timed:
    kwargs, assistant_config, _ = transformers_settings(setup, k)
    assistant = setup.assistant if setup.draft_kind == "model" else setup.target
    eos = setup.eos_token_ids or None
    # Count the target's own passes. Early exit drafts with the target itself, its layer count
    # temporarily cut to L: those calls are drafts, not passes.
    base = getattr(setup.target, setup.target.base_model_prefix, setup.target)
    layers, passes = base.config.num_hidden_layers, [0]

    def count(module, args):
        passes[0] += base.config.num_hidden_layers == layers

    handle = setup.target.register_forward_pre_hook(count)
    try:
        with generation_config_set(assistant, assistant_config), torch.inference_mode():
            start = clock()
            out = setup.target.generate(input_ids, do_sample=False, num_beams=1, max_new_tokens=max_new_tokens,
                                        eos_token_id=eos, pad_token_id=(eos or [0])[0],
                                        attention_mask=torch.ones_like(input_ids), **kwargs)
            seconds = clock() - start
    finally:
        handle.remove()
    return Timed(out[0, input_ids.shape[1]:].tolist(), seconds, target_passes=passes[0])


# ----------------------------------------------------------------------------- one prompt, all prompts

METHODS = ("plain", "specviz", "transformers")


def clock_for(device: torch.device, kind: str = "wall") -> Callable[[], float]:
    """Wall-clock (synchronising the GPU), or this process's CPU time: on a shared CPU machine with
    one torch thread, CPU time is what the run would take with the machine to itself."""
    return time.process_time if kind == "process" else Clock(device)


def bench_row(setup: Setup, prompt: BenchPrompt, input_ids: torch.Tensor, runs: dict[str, list[Timed]],
              k: int) -> dict:
    """One JSON row from the repeated runs of one prompt (medians of tokens/s)."""
    plain, spec, hf = runs["plain"][0], runs["specviz"][0], runs["transformers"][0]
    stats = summarize(spec.cycles)
    median = {name: statistics.median(t.tokens_per_s for t in timed) for name, timed in runs.items()}
    passes = len(spec.cycles)
    row = {
        "id": prompt.id, "category": prompt.category, "target": setup.target_name, "draft": setup.draft_name,
        "dtype": str(setup.dtype).removeprefix("torch."), "k": k, "prompt_tokens": int(input_ids.shape[1]),
        "new_tokens": len(spec.tokens),
        "acceptance_rate": stats.draft_acceptance_rate, "alpha": stats.alpha,
        "tokens_per_pass": stats.mean_acceptance_length, "target_passes": passes,
        "transformers_target_passes": hf.target_passes,
        "expected_tokens_per_pass": stats.expected_tokens_per_pass,
        "mean_drafted": stats.drafted / passes if passes else 0.0,
        "cost_ratio": stats.cost_ratio, "expected_speedup": stats.expected_speedup,
        "baseline_tokens_per_s": median["plain"], "specviz_tokens_per_s": median["specviz"],
        "transformers_tokens_per_s": median["transformers"],
        "specviz_speedup": _ratio(median["specviz"], median["plain"]),
        "transformers_speedup": _ratio(median["transformers"], median["plain"]),
        "specviz_vs_transformers": _ratio(median["specviz"], median["transformers"]),
        "identical_to_baseline": spec.tokens == plain.tokens,
        "first_divergence": first_divergence(spec.tokens, plain.tokens),
        "transformers_identical_to_baseline": hf.tokens == plain.tokens,
        "repeats": len(runs["plain"]),
    }
    row["speedup_vs_theory"] = _ratio(row["specviz_speedup"], row["expected_speedup"])
    # The theory prices a verification pass like one plain step; this is what it really cost
    # (medians, prefill left out).
    passes_seconds = [c.verify_seconds for c in spec.cycles[1:]]
    steps_seconds = plain.step_seconds[1:]
    row["verify_pass_cost"] = (_ratio(statistics.median(passes_seconds), statistics.median(steps_seconds))
                               if passes_seconds and steps_seconds else None)
    # The theory with that price: what is left between it and the measured speedup is the
    # engine's own time and how far acceptance is from the theory's independent-tokens model.
    row["expected_speedup_at_pass_cost"] = (_ratio(row["expected_speedup"], row["verify_pass_cost"])
                                            if row["verify_pass_cost"] else None)
    return row


def run_bench(setup: Setup, prompts: Sequence[BenchPrompt], *, k: int, max_new_tokens: int, repeats: int = 1,
              clock: str = "wall", warmup: bool = True, progress: Callable[[str], None] | None = None) -> list[dict]:
    """Rows for `prompts`, the methods alternating prompt by prompt, `repeats` rounds."""
    tick = clock_for(setup.device, clock)
    encoded = [setup.encode(p.prompt, p.chat).to(setup.device) for p in prompts]
    methods = {"plain": lambda ids, n: run_plain(setup, ids, n, tick),
               "specviz": lambda ids, n: run_specviz(setup, ids, n, k, tick),
               "transformers": lambda ids, n: run_transformers(setup, ids, n, k, tick)}
    if warmup and encoded:   # one-time costs (allocator, lazy init, kernel choice) are paid here
        for method in methods.values():
            method(encoded[0], min(max_new_tokens, 16))
    runs = [{name: [] for name in METHODS} for _ in prompts]
    for round_ in range(repeats):
        for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
            for name, method in methods.items():
                runs[i][name].append(method(ids, max_new_tokens))
            if progress:
                r = runs[i]
                progress(f"[{round_ + 1}/{repeats}] {prompt.id:<20} plain {r['plain'][-1].tokens_per_s:6.1f}  "
                         f"specviz {r['specviz'][-1].tokens_per_s:6.1f}  "
                         f"transformers {r['transformers'][-1].tokens_per_s:6.1f} tokens/s")
    return [bench_row(setup, prompt, ids, r, k) for prompt, ids, r in zip(prompts, encoded, runs)]


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


# ----------------------------------------------------------------------------- summaries

SUMMARY_KEYS = ("acceptance_rate", "tokens_per_pass", "cost_ratio", "baseline_tokens_per_s", "specviz_tokens_per_s",
                "transformers_tokens_per_s", "specviz_speedup", "transformers_speedup", "specviz_vs_transformers",
                "expected_speedup", "speedup_vs_theory", "expected_tokens_per_pass", "verify_pass_cost",
                "expected_speedup_at_pass_cost")


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
            entry[key] = statistics.median(values) if values else None
        entry["identical"] = sum(m["identical_to_baseline"] for m in members)
        entry["transformers_identical"] = sum(m["transformers_identical_to_baseline"] for m in members)
        summary.append(entry)
    return summary


COLUMNS = [("draft", "draft", "{}"), ("category", "category", "{}"), ("accept", "acceptance_rate", "{:.0%}"),
           ("tok/pass", "tokens_per_pass", "{:.2f}"), ("c", "cost_ratio", "{:.3f}"),
           ("plain tok/s", "baseline_tokens_per_s", "{:.1f}"), ("specviz tok/s", "specviz_tokens_per_s", "{:.1f}"),
           ("HF tok/s", "transformers_tokens_per_s", "{:.1f}"), ("specviz speedup", "specviz_speedup", "{:.2f}x"),
           ("HF speedup", "transformers_speedup", "{:.2f}x"), ("specviz/HF", "specviz_vs_transformers", "{:.2f}"),
           ("theory", "expected_speedup", "{:.2f}x"), ("pass cost", "verify_pass_cost", "{:.2f}"),
           ("theory at pass cost", "expected_speedup_at_pass_cost", "{:.2f}x"),
           ("identical to plain", None, None)]


def markdown_table(summary: Sequence[dict]) -> str:
    header = "| " + " | ".join(name for name, _, _ in COLUMNS) + " |"
    lines = [header, "|" + "|".join("---" if key in ("draft", "category") else "---:" for _, key, _ in COLUMNS) + "|"]
    for entry in summary:
        cells = []
        for _, key, fmt in COLUMNS:
            if key is None:
                cells.append(f"{entry['identical']}/{entry['prompts']} (HF {entry['transformers_identical']})")
            elif key == "category" and entry[key] == "overall":
                cells.append("**overall**")
            elif entry.get(key) is None:
                cells.append("")
            else:
                cells.append(fmt.format(entry[key]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()} (CUDA {torch.version.cuda})"
    name = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                name = line.partition(":")[2].strip()
                break
    return f"{name}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"


def describe(setup: Setup, k: int, max_new_tokens: int, clock: str) -> dict:
    import transformers

    return {"target": setup.target_name, "draft": setup.draft_name, "device": str(setup.device),
            "dtype": str(setup.dtype).removeprefix("torch."), "k": k, "max_new_tokens": max_new_tokens,
            "hardware": hardware(), "torch": torch.__version__, "transformers": transformers.__version__,
            "clock": clock, "transformers_settings": transformers_settings(setup, k)[2],
            "eos_token_ids": setup.eos_token_ids}


# ----------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .cli import add_model_arguments

    add_model_arguments(parser, draft_repeatable=True)
    for action in parser._actions:   # the shared flags, plus what only the bench understands
        if action.dest == "target":
            action.help += "; 'tiny': a tiny Llama pair built in-process (no model files)"
        elif action.dest == "draft":
            action.help += "; with --target tiny: 'tiny' (its 2-layer draft model, the default), 'ngram' or 'self:L'"
    parser.add_argument("--k", type=int, default=None,
                        help=f"draft length (default per drafter: ngram {DEFAULT_K['ngram']}, "
                             f"self:L {DEFAULT_K['self']}, draft model {DEFAULT_K['model']})")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--category", action="append", default=None,
                        help="only this category (repeat or comma-separate): chat, code, rewrite, summarisation, "
                             "translation, maths")
    parser.add_argument("--limit", type=int, default=None, help="at most this many prompts per category")
    parser.add_argument("--repeats", type=int, default=1, help="rounds over the prompt set (medians are reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    parser.add_argument("--clock", choices=("wall", "process"), default="wall",
                        help="wall-clock time, or this process's CPU time (for a shared machine, with --threads 1)")
    parser.add_argument("--prompts", type=Path, default=PROMPTS_FILE, help="prompt set (JSON)")
    parser.add_argument("--json", type=Path, default=None, metavar="FILE", help="write meta, rows and summary as JSON")
    parser.add_argument("--markdown", type=Path, default=None, metavar="FILE", help="also write the markdown table here")
    parser.add_argument("--quiet", action="store_true", help="no per-prompt progress lines")


def main(args: argparse.Namespace) -> int:
    from .cli import fail

    if args.threads:
        torch.set_num_threads(args.threads)
    categories = [c.strip() for arg in (args.category or []) for c in arg.split(",") if c.strip()]
    drafts = args.draft or [None]
    say = (lambda message: None) if args.quiet else (lambda message: print(message, file=sys.stderr, flush=True))
    try:
        prompts = load_prompts(args.prompts, categories or None, args.limit)
        results = []
        for draft in drafts:
            setup = load_setup(args.target, draft, device=args.device, dtype=args.dtype, chat=not args.raw)
            k = args.k or DEFAULT_K[setup.draft_kind]
            meta = describe(setup, k, args.max_new_tokens, args.clock)
            say(f"{meta['target']} + {meta['draft']} (k={k}) on {meta['hardware']}, {meta['dtype']}, "
                f"{len(prompts)} prompts, {args.max_new_tokens} new tokens; transformers: {meta['transformers_settings']}")
            rows = run_bench(setup, prompts, k=k, max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                             clock=args.clock, progress=say)
            results.append({"meta": meta, "rows": rows, "summary": summarize_rows(rows)})
    except BenchError as error:
        return fail(str(error))
    except KeyboardInterrupt:
        return fail("cancelled", 130)

    summary = [entry for result in results for entry in result["summary"]]
    table = markdown_table(summary)
    meta = results[0]["meta"]
    print(f"hardware: {meta['hardware']}; device {meta['device']}, {meta['dtype']}; torch {meta['torch']}, "
          f"transformers {meta['transformers']}; {args.max_new_tokens} new tokens, greedy; clock: {args.clock}")
    for result in results:
        print(f"transformers for {result['meta']['draft']}: {result['meta']['transformers_settings']}")
    print()
    print(table)
    if args.markdown:
        args.markdown.write_text(table + "\n")
    if args.json:
        args.json.write_text(json.dumps({"meta": [r["meta"] for r in results],
                                         "rows": [row for r in results for row in r["rows"]],
                                         "summary": summary}, indent=2))
        print(f"\nwrote {args.json}")
    return 0
