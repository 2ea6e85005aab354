"""The benchmark's summary (`runs.bench.summarize_rows`) as a markdown table, one row per (draft,
category), the columns named as the README's benchmark section explains them. A draft drafted
across tokenizers is marked so, with its draft model's tokens per target token."""

from __future__ import annotations

from collections.abc import Sequence

from ..runs.comparison import CROSS_TOKENIZER_MARK

# (header, summary key, format); the last column counts outputs identical to plain decoding.
COLUMNS = [("draft", "draft", "{}"), ("category", "category", "{}"), ("accept", "acceptance_rate", "{:.0%}"),
           ("tok/pass", "tokens_per_cycle", "{:.2f}"), ("nodes/pass", "nodes_per_pass", "{:.1f}"),
           ("c", "cost_ratio", "{:.3f}"),
           ("plain tok/s", "baseline_tokens_per_s", "{:.1f}"), ("specviz tok/s", "specviz_tokens_per_s", "{:.1f}"),
           ("HF tok/s", "transformers_tokens_per_s", "{:.1f}"), ("specviz speedup", "specviz_speedup", "{:.2f}x"),
           ("HF speedup", "transformers_speedup", "{:.2f}x"), ("specviz/HF", "specviz_vs_transformers", "{:.2f}"),
           ("theory", "expected_speedup", "{:.2f}x"), ("pass cost", "verify_pass_cost", "{:.2f}"),
           ("theory at pass cost", "expected_speedup_at_pass_cost", "{:.2f}x"),
           ("draft tok/target tok", "draft_tokens_per_target_token", "{:.2f}"),
           ("identical to plain", None, None)]
# Shown only when some row has a value (a draft with another tokenizer, drafted across tokenizers).
OPTIONAL = {"draft_tokens_per_target_token"}


def markdown_table(summary: Sequence[dict]) -> str:
    columns = [c for c in COLUMNS if c[1] not in OPTIONAL or any(e.get(c[1]) is not None for e in summary)]
    header = "| " + " | ".join(name for name, _, _ in columns) + " |"
    lines = [header, "|" + "|".join("---" if key in ("draft", "category") else "---:" for _, key, _ in columns) + "|"]
    for entry in summary:
        cells = []
        for _, key, fmt in columns:
            if key is None:
                cells.append(f"{entry['identical']}/{entry['prompts']} (HF {entry['transformers_identical']})")
            elif key == "draft" and entry.get("cross_tokenizer"):
                cells.append(entry[key] + CROSS_TOKENIZER_MARK)
            elif key == "category" and entry[key] == "overall":
                cells.append("**overall**")
            elif entry.get(key) is None:
                cells.append("")
            else:
                cells.append(fmt.format(entry[key]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
