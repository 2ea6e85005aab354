"""GPU benchmark of the specviz engine on models with real shapes and random weights.

Nothing is downloaded and nothing needs a network or gradio: every model is a Llama built in-process
from a config with the shapes of a real one (SmolLM2-1.7B, SmolLM2-135M, Llama-3-8B, Llama-3.2-1B),
in bf16. Random weights make acceptance meaningless except at the two extremes, so the pairs are:
the target as its own draft (everything accepted: the upper bound of speculation) and a small
random draft (almost nothing accepted: the overhead floor), plus prompt lookup.

Three measurements, written to $OUT (or --out) as gpu_bench.json and gpu_bench.md:
1. per-pass cost against k: one target forward over q = 1..16 new tokens after a 512-token context,
   as a multiple of the one-token forward (the theory's assumption is that it stays ~1);
2. throughput of plain decoding, specviz speculative decoding and transformers' assisted
   generation (same drafter, fixed k, greedy), measured as `python -m specviz bench` measures it
   (`runs.bench.run_bench`: plain and speculative raced per prompt, transformers after), medians;
3. engine overhead: wall time outside model forwards per generated token and per cycle, measured
   with forward hooks that synchronise the device (so measured in a separate, slower run).

    python scripts/gpu_bench.py                       # CUDA, full shapes, < 8 minutes on one GPU
    python scripts/gpu_bench.py --device cpu --small  # smoke mode: tiny shapes, seconds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import AutoModelForCausalLM, DynamicCache, LlamaConfig  # noqa: E402

from specviz.catalog import BenchPrompt  # noqa: E402
from specviz.core.plain import autoregressive_decode  # noqa: E402
from specviz.core.decoding import speculative_decode  # noqa: E402
from specviz.core.timing import Clock  # noqa: E402
from specviz.models import ModelPair, make_drafter  # noqa: E402
from specviz.models.tiny import ByteTokenizer  # noqa: E402
from specviz.runs.bench import Setup, run_bench, run_transformers, summarize_rows, transformers_settings  # noqa: E402
from specviz.runs.run import encode  # noqa: E402
from specviz.settings import LOCAL, RunSettings, validate  # noqa: E402

SHAPES = {   # Llama-architecture shapes of real models (weights random)
    "SmolLM2-1.7B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=24, num_attention_heads=32,
                         num_key_value_heads=32, vocab_size=49152, tie_word_embeddings=True),
    "SmolLM2-135M": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                         num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "Llama-3-8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                       num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=False),
    "Llama-3.2-1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, vocab_size=128256, tie_word_embeddings=True),
    # --small: the same code paths in seconds on a CPU
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False),
    "tiny-draft": dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
                       num_key_value_heads=2, vocab_size=256, tie_word_embeddings=False),
}
# (target, draft, k): "self" = the target drafts for itself (all accepted), "ngram" = prompt lookup.
FULL = [("SmolLM2-1.7B", "self", 4), ("SmolLM2-1.7B", "SmolLM2-135M", 4), ("SmolLM2-1.7B", "ngram", 8),
        ("Llama-3-8B", "self", 4), ("Llama-3-8B", "Llama-3.2-1B", 4)]
SMALL = [("tiny", "self", 4), ("tiny", "tiny-draft", 4), ("tiny", "ngram", 8)]


def build(shape: str, device: torch.device, dtype: torch.dtype, seed: int):
    config = LlamaConfig(max_position_embeddings=8192, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                         **SHAPES[shape])
    torch.manual_seed(seed)
    with torch.device(device):   # initialise on the device: an 8B model in seconds, not minutes
        model = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


# ----------------------------------------------------------------------------- 1. pass cost

@torch.inference_mode()
def pass_costs(model, context: int, max_q: int, repeats: int) -> dict:
    """Median seconds of one forward over q new tokens (logits for all q), q = 1..max_q."""
    clock = Clock(model.device)
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, context + max_q), device=model.device, generator=None)
    cache = DynamicCache(config=model.config)
    model(ids[:, :context], cache=cache, logits_to_keep=1)
    for _ in range(3):   # warm-up
        model(ids[:, context:context + max_q], cache=cache, logits_to_keep=max_q)
        cache.crop(-max_q)
    costs = {}
    for q in range(1, max_q + 1):
        times = []
        for _ in range(repeats):
            start = clock()
            model(ids[:, context:context + q], cache=cache, logits_to_keep=q)
            times.append(clock() - start)
            cache.crop(-q)
        costs[q] = statistics.median(times)
    return costs


# ----------------------------------------------------------------------------- 2. throughput, 3. overhead

class ForwardTimer:
    """Forward hooks that synchronise the device around every model call and add up the time
    spent inside; what is left of a run's wall time is the engine's own (and transformers')."""

    def __init__(self, models):
        self.models = list({id(m): m for m in models}.values())
        self.seconds, self.calls, self._start, self._handles = 0.0, 0, 0.0, []
        self.clock = Clock(self.models[0].device)

    def __enter__(self):
        for model in self.models:
            self._handles.append(model.register_forward_pre_hook(self._pre))
            self._handles.append(model.register_forward_hook(self._post))
        return self

    def __exit__(self, *exc):
        for handle in self._handles:
            handle.remove()

    def _pre(self, module, args):
        self._start = self.clock()

    def _post(self, module, args, output):
        self.seconds += self.clock() - self._start
        self.calls += 1


def make_setup(target, target_name: str, draft_name: str, draft_model, dtype, k: int, max_new_tokens: int) -> Setup:
    """A `runs.bench.Setup` for random-weight models: prompts are bytes (`ByteTokenizer`), and the
    target drafting for itself ("self") is a draft model that happens to be the target."""
    spec = "ngram" if draft_name == "ngram" else "draft-model"   # "self" is not an early exit here
    drafter = make_drafter(spec, target, draft_model=draft_model)
    pair = ModelPair(target=target, tokenizer=ByteTokenizer(), draft=drafter, target_name=target_name,
                     draft_name=draft_name, target_parameters=sum(p.numel() for p in target.parameters()),
                     draft_parameters=drafter.parameters, device=target.device, dtype=dtype, eos_token_ids=[])
    settings = validate(RunSettings(target=target_name, draft=spec, k=k, max_new_tokens=max_new_tokens,
                                    chat=False), LOCAL)
    return Setup(settings, pair)


def prompts_for(count: int, length: int, seed: int = 0) -> list[BenchPrompt]:
    """Random lowercase prompts whose second half repeats their first (so prompt lookup has something
    to find); one byte is one token."""
    generator = torch.Generator().manual_seed(seed)
    prompts = []
    for i in range(count):
        half = "".join(chr(97 + c) for c in torch.randint(0, 26, (length // 2,), generator=generator).tolist())
        prompts.append(BenchPrompt(f"random-{i}", "random", half + half, chat=False))
    return prompts


def throughput(setup: Setup, prompts: list[BenchPrompt]) -> dict:
    """The bench's own method (`runs.bench.run_bench`): warm-up, then per prompt specviz's race of
    plain and speculative decoding, then transformers; medians over prompts."""
    rows = run_bench(setup, prompts)
    overall = summarize_rows(rows)[-1]
    return {"plain_tokens_per_s": overall["baseline_tokens_per_s"],
            "specviz_tokens_per_s": overall["specviz_tokens_per_s"],
            "transformers_tokens_per_s": overall["transformers_tokens_per_s"],
            "specviz_speedup": overall["specviz_speedup"], "transformers_speedup": overall["transformers_speedup"],
            "specviz_vs_transformers": overall["specviz_vs_transformers"],
            "acceptance_rate": overall["acceptance_rate"], "tokens_per_cycle": overall["tokens_per_cycle"],
            "cost_ratio": overall["cost_ratio"], "expected_speedup": overall["expected_speedup"],
            "identical_to_baseline": overall["identical"], "prompts": len(prompts),
            "first_divergences": [row["first_divergence"] for row in rows],
            "transformers_identical_to_baseline": overall["transformers_identical"]}


def overhead(setup: Setup, prompt: BenchPrompt) -> dict:
    """Wall time outside model forwards, per generated token, for each method (and per cycle for
    specviz). The engine's loops run alone here (not raced), each timed as one call."""
    pair, settings = setup.pair, setup.settings
    clock = Clock(setup.device)
    ids = encode(settings, prompt.prompt, pair)
    models = [pair.target] + ([setup.assistant] if setup.assistant is not None else [])

    def plain():
        return [s.token for s in autoregressive_decode(pair.target, ids, settings.max_new_tokens)], []

    def specviz():
        cycles = list(speculative_decode(pair.target, pair.draft, ids, settings.max_new_tokens, k=settings.k))
        return [t for c in cycles for t in c.emitted], cycles

    def transformers_():
        return run_transformers(setup, ids, clock).tokens, []

    result = {}
    for name, method in (("plain", plain), ("specviz", specviz), ("transformers", transformers_)):
        with ForwardTimer(models) as timer:
            start = clock()
            tokens, cycles = method()
            seconds = clock() - start
        outside = seconds - timer.seconds
        entry = {"seconds": seconds, "forward_seconds": timer.seconds, "forward_calls": timer.calls,
                 "tokens": len(tokens), "outside_ms_per_token": 1e3 * outside / max(len(tokens), 1)}
        if cycles:
            entry["cycles"] = len(cycles)
            entry["outside_ms_per_cycle"] = 1e3 * outside / len(cycles)
        result[name] = entry
    return result


# ----------------------------------------------------------------------------- report

def markdown(report: dict) -> str:
    lines = ["# specviz GPU benchmark", "",
             f"{report['hardware']}; torch {report['torch']}, transformers {report['transformers']}; "
             f"{report['dtype']}; random weights, real shapes; greedy; {report['max_new_tokens']} new tokens; "
             f"{report['prompts']} prompts of {report['prompt_length']} tokens", ""]
    if report["pass_cost"]:
        max_q = max(len(costs["ms"]) for costs in report["pass_cost"].values())
        lines += [f"## Cost of one forward over q new tokens after a {report['context']}-token context "
                  "(ms, and x the q=1 cost)", "",
                  "| model | " + " | ".join(f"q={q}" for q in range(1, max_q + 1)) + " |",
                  "|---|" + "---:|" * max_q]
        for name, costs in report["pass_cost"].items():
            base = costs["ms"]["1"]
            cells = [f"{costs['ms'][str(q)]:.2f} ({costs['ms'][str(q)] / base:.2f}x)" if str(q) in costs["ms"] else ""
                     for q in range(1, max_q + 1)]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
    if report["pairs"]:
        lines += ["## Throughput (tokens/s, medians) and engine overhead", "",
                  "| target | draft | k | accept | tok/pass | c | plain | specviz | HF | specviz speedup | HF speedup "
                  "| specviz/HF | theory | identical | outside fwd ms/token: plain / specviz / HF | specviz ms/cycle |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
        for pair in report["pairs"]:
            t, o = pair["throughput"], pair["overhead"]
            lines.append(
                f"| {pair['target']} | {pair['draft']} | {pair['k']} | {t['acceptance_rate']:.0%} | "
                f"{t['tokens_per_cycle']:.2f} | {t['cost_ratio']:.3f} | {t['plain_tokens_per_s']:.1f} | "
                f"{t['specviz_tokens_per_s']:.1f} | {t['transformers_tokens_per_s']:.1f} | "
                f"{t['specviz_speedup']:.2f}x | {t['transformers_speedup']:.2f}x | "
                f"{t['specviz_vs_transformers']:.2f} | {t['expected_speedup']:.2f}x | "
                f"{t['identical_to_baseline']}/{t['prompts']} | {o['plain']['outside_ms_per_token']:.2f} / "
                f"{o['specviz']['outside_ms_per_token']:.2f} / {o['transformers']['outside_ms_per_token']:.2f} | "
                f"{o['specviz'].get('outside_ms_per_cycle', 0):.2f} |")
        lines.append("")
    if report["skipped"]:
        lines += ["Skipped (time budget): " + ", ".join(report["skipped"]), ""]
    return "\n".join(lines)


def save(report: dict, out: Path) -> None:
    (out / "gpu_bench.json").write_text(json.dumps(report, indent=2))
    (out / "gpu_bench.md").write_text(markdown(report))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default=None, help="default bfloat16 (float32 with --small)")
    parser.add_argument("--small", action="store_true", help="tiny shapes: a smoke test that runs on a CPU in seconds")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_bench_out"))
    parser.add_argument("--max-new-tokens", type=int, default=None, help="default 128 (16 with --small)")
    parser.add_argument("--prompts", type=int, default=None, help="prompts per pair (default 3, 2 with --small)")
    parser.add_argument("--prompt-length", type=int, default=128)
    parser.add_argument("--max-q", type=int, default=None, help="pass cost up to this many new tokens (default 16)")
    parser.add_argument("--budget-s", type=float, default=420.0, help="skip what is left after this many seconds")
    args = parser.parse_args(argv)

    started = time.perf_counter()
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.small else torch.bfloat16)
    max_new_tokens = args.max_new_tokens or (16 if args.small else 128)
    prompt_count = args.prompts or (2 if args.small else 3)
    max_q = args.max_q or (4 if args.small else 16)
    plan = SMALL if args.small else FULL
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)

    hardware = (f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})" if device.type == "cuda"
                else f"{platform.processor() or platform.machine()} CPU, {torch.get_num_threads()} threads")
    report = {"hardware": hardware, "torch": torch.__version__, "transformers": transformers.__version__,
              "dtype": str(dtype).removeprefix("torch."), "max_new_tokens": max_new_tokens, "prompts": prompt_count,
              "prompt_length": args.prompt_length, "context": 32 if args.small else 512,
              "pass_cost": {}, "pairs": [], "skipped": []}
    print(f"{hardware}; {report['dtype']}; writing to {args.out}", flush=True)

    def over_budget() -> bool:
        return time.perf_counter() - started > args.budget_s

    models: dict[str, torch.nn.Module] = {}   # all of them fit at once (about 22 GB in bf16)

    def model(shape: str):
        if shape not in models:
            models[shape] = build(shape, device, dtype, seed=len(models) + 1)
        return models[shape]

    for target_name, draft_name, k in plan:
        label = f"{target_name} + {draft_name}"
        if over_budget():
            report["skipped"].append(label)
            continue
        target = model(target_name)
        if target_name not in report["pass_cost"]:
            costs = pass_costs(target, report["context"], max_q, repeats=5 if args.small else 10)
            report["pass_cost"][target_name] = {"ms": {str(q): 1e3 * s for q, s in costs.items()}}
            print(f"{target_name}: one forward over q=1..{max_q} new tokens: "
                  + ", ".join(f"{1e3 * s:.1f}" for s in costs.values()) + " ms", flush=True)
        draft_model = target if draft_name == "self" else None if draft_name == "ngram" else model(draft_name)
        if draft_model is not None and draft_name != "self" and draft_name not in report["pass_cost"]:
            costs = pass_costs(draft_model, report["context"], 1, repeats=5 if args.small else 10)
            report["pass_cost"][draft_name] = {"ms": {str(q): 1e3 * s for q, s in costs.items()}}
        setup = make_setup(target, target_name, draft_name, draft_model, dtype, k, max_new_tokens)
        prompts = prompts_for(prompt_count, args.prompt_length)
        pair = {"target": target_name, "draft": draft_name, "k": k,
                "transformers_settings": transformers_settings(setup)[2],
                "throughput": throughput(setup, prompts),
                "overhead": overhead(setup, prompts[0])}
        report["pairs"].append(pair)
        t = pair["throughput"]
        print(f"{label} (k={k}): plain {t['plain_tokens_per_s']:.1f}, specviz {t['specviz_tokens_per_s']:.1f}, "
              f"transformers {t['transformers_tokens_per_s']:.1f} tokens/s; acceptance {t['acceptance_rate']:.0%}; "
              f"outside forwards {pair['overhead']['specviz']['outside_ms_per_token']:.2f} ms/token "
              f"(HF {pair['overhead']['transformers']['outside_ms_per_token']:.2f})", flush=True)
        save(report, args.out)   # after every pair: a killed run still leaves its results

    report["seconds"] = time.perf_counter() - started
    save(report, args.out)
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
