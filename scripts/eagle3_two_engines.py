"""One EAGLE-3 head, two engines: the same folder served by vLLM (`method: eagle3`) and drafting in
specviz's own loop, on the same prompts, greedy, at the same k. Prints, per prompt, whether vLLM's
speculative text equals its plain server's and specviz's text, and each engine's mean acceptance
length and per-position acceptance (the share of drafting steps whose draft was accepted at least that
far). Both draft greedily from the same features with the same weights, so in fp32 the figures
should agree; a real disagreement is a bug in one of them.

    SPECVIZ_VLLM_PYTHON=~/.cache/specviz-vllm-venv/bin/python HF_HUB_OFFLINE=1 \\
        python scripts/eagle3_two_engines.py --head DIR --k 3 --dtype float32 --max-new-tokens 64

specviz counts, as vLLM does, only the passes that drafted (its first pass, the prompt's, drafts
nothing: the head has no features yet; vLLM's prefill step drafts after it, the same information).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz import speculative_decode  # noqa: E402
from specviz.catalog import prompt_set  # noqa: E402
from specviz.engines import VllmEngine, closed_loop, engine_configs, model_location  # noqa: E402
from specviz.engines.vllm_client import Request  # noqa: E402
from specviz.models import encode_prompt  # noqa: E402
from specviz.models.host import load_average  # noqa: E402
from specviz.metrics import acceptance_rate_per_position  # noqa: E402
from specviz.runs.engine_load import acceptance  # noqa: E402
from specviz.runs.run import load  # noqa: E402
from specviz.settings import RunSettings, parse_draft  # noqa: E402


def specviz_figures(pair, prompt: str, k: int, max_new_tokens: int) -> tuple[str, list[int]]:
    """specviz's text and its histogram (passes that accepted exactly 0, 1, ..., k drafts)."""
    ids = encode_prompt(pair.tokenizer, prompt)
    cycles = list(speculative_decode(pair.target, pair.draft, ids, max_new_tokens=max_new_tokens, k=k,
                                     eos_token_id=pair.eos_token_ids))
    histogram = [0] * (k + 1)
    for cycle in cycles:
        if cycle.drafted:
            histogram[cycle.num_accepted] += 1
    text = pair.tokenizer.decode([t for c in cycles for t in c.emitted], skip_special_tokens=True)
    return text, histogram


def mean_length(histogram: list[int]) -> float:
    steps = sum(histogram)
    return 1.0 + sum(i * n for i, n in enumerate(histogram)) / max(steps, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--head", required=True, help="the head's folder (speculators format)")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", default="chat", help="a prompt set")
    parser.add_argument("--count", type=int, default=4)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    prompts = [p.prompt for p in prompt_set(args.prompts)][:args.count]
    draft = parse_draft(f"head:{Path(args.head).resolve()}")
    say = lambda message: print(message, file=sys.stderr, flush=True)  # noqa: E731
    engine = VllmEngine(model=model_location(None), dtype=args.dtype, say=say)
    requests = [Request(i, p, True, args.max_new_tokens) for i, p in enumerate(prompts)]
    texts, vllm_figures = {}, {}
    for config in engine_configs(draft, [args.k]):
        with engine.serve(config) as served:
            responses = sorted(closed_loop(served.url, served.model, requests, 1), key=lambda r: r.index)
        texts[config.k] = [r.text for r in responses]
        vllm_figures[config.k] = [acceptance([r]) for r in responses]

    pair = load(RunSettings(draft=draft, k=args.k, dtype=args.dtype, max_new_tokens=args.max_new_tokens))
    rows, all_vllm, all_own = [], [0] * (args.k + 1), [0] * (args.k + 1)
    for i, prompt in enumerate(prompts):
        own_text, own = specviz_figures(pair, prompt, args.k, args.max_new_tokens)
        theirs = (vllm_figures[args.k][i] or {}).get("acceptance_histogram") or []
        theirs = (theirs + [0] * (args.k + 1))[:args.k + 1]
        all_vllm = [a + b for a, b in zip(all_vllm, theirs)]
        all_own = [a + b for a, b in zip(all_own, own)]
        rows.append({"prompt": prompt[:60], "vllm_spec_equals_plain": texts[args.k][i] == texts[0][i],
                     "specviz_equals_vllm_plain": own_text.strip() == texts[0][i].strip(),
                     "vllm_histogram": theirs, "specviz_histogram": own,
                     "vllm_mean_acceptance_length": mean_length(theirs),
                     "specviz_mean_acceptance_length": mean_length(own)})
        r = rows[-1]
        print(f"{i}: vLLM spec = plain {r['vllm_spec_equals_plain']}, "
              f"specviz = vLLM plain {r['specviz_equals_vllm_plain']}; mean acceptance length "
              f"vLLM {r['vllm_mean_acceptance_length']:.2f} {theirs}, "
              f"specviz {r['specviz_mean_acceptance_length']:.2f} {own}")
    summary = {"k": args.k, "dtype": args.dtype, "max_new_tokens": args.max_new_tokens, "rows": rows,
               "vllm": {"mean_acceptance_length": mean_length(all_vllm), "histogram": all_vllm,
                        "by_position": acceptance_rate_per_position(all_vllm)},
               "specviz": {"mean_acceptance_length": mean_length(all_own), "histogram": all_own,
                           "by_position": acceptance_rate_per_position(all_own)},
               "load_average": load_average()}
    for name in ("vllm", "specviz"):
        figures = summary[name]
        print(f"all, {name}: mean acceptance length {figures['mean_acceptance_length']:.3f}, by position "
              f"{[round(x, 3) for x in figures['by_position']]}, histogram {figures['histogram']}")
    print(f"load average {summary['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
