"""The benchmark's summary (`runs.bench.summarize_rows`) as a markdown table, one row per (draft,
category), the columns named as the README's benchmark section explains them. A draft drafted
across tokenizers is marked so, with its draft model's tokens per target token. And as Spec-Bench's
leaderboard (`leaderboard`): a row per method, a column per category, each cell the speedup and the
mean accepted tokens (new tokens per target pass), as markdown, CSV or JSON rows."""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence

from ..runs.comparison import CROSS_TOKENIZER_MARK

# (header, summary key, format); the last column counts outputs identical to plain decoding (and those
# that parted at a near-tie and were compared along the speculative text, `equal_work.ALONG_NEAR_TIES`).
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
                hf = entry.get("transformers_identical")
                theirs = "" if hf is None else f" (HF {hf})"
                along = entry.get("along_near_ties") or 0
                same = f" (+{along} along near-ties)" if along else ""
                cells.append(f"{entry['identical']}/{entry['prompts']}{same}{theirs}")
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


# ----------------------------------------------------------------------------- Spec-Bench's leaderboard

def leaderboard(summary: Sequence[dict]) -> list[dict]:
    """Spec-Bench's leaderboard from the summary: plain decoding, then per drafter specviz and, where
    transformers has that drafter, transformers; each row's `cells` map a category (and 'overall') to
    {"speedup", "mean_accepted_tokens"} (medians over the category's prompts)."""
    categories = list(dict.fromkeys(e["category"] for e in summary if e["category"] != "overall")) + ["overall"]
    drafts = list(dict.fromkeys(e["draft"] for e in summary))
    cell = {(e["draft"], e["category"]): e for e in summary}
    rows = [{"method": "plain decoding", "cells": {c: {"speedup": 1.0, "mean_accepted_tokens": 1.0}
                                                   for c in categories}}]
    for engine, speedup, per_pass in (("specviz", "specviz_speedup", "tokens_per_cycle"),
                                      ("transformers", "transformers_speedup", "transformers_tokens_per_pass")):
        for draft in drafts:
            cells = {c: {"speedup": cell[(draft, c)].get(speedup),
                         "mean_accepted_tokens": cell[(draft, c)].get(per_pass)}
                     for c in categories if (draft, c) in cell}
            if any(v["speedup"] is not None for v in cells.values()):
                rows.append({"method": f"{engine} {draft}", "cells": cells})
    return rows


def _leaderboard_cell(values: dict | None) -> str:
    if not values or values.get("speedup") is None:
        return ""
    accepted = values.get("mean_accepted_tokens")
    return f"{values['speedup']:.2f}x" + (f" ({accepted:.2f})" if accepted is not None else "")


def leaderboard_markdown(rows: Sequence[dict]) -> str:
    """The leaderboard as markdown: each cell 'speedup (mean accepted tokens)'."""
    categories = list(rows[0]["cells"]) if rows else []
    lines = ["| method | " + " | ".join(categories) + " |", "|---|" + "---:|" * len(categories)]
    for row in rows:
        lines.append(f"| {row['method']} | " + " | ".join(_leaderboard_cell(row["cells"].get(c)) for c in categories)
                     + " |")
    return "\n".join(lines)


def leaderboard_csv(rows: Sequence[dict]) -> str:
    """The leaderboard as CSV: per category a speedup column and a mean accepted tokens column."""
    categories = list(rows[0]["cells"]) if rows else []
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["method"] + [f"{c} {what}" for c in categories for what in ("speedup", "mean_accepted_tokens")])
    for row in rows:
        writer.writerow([row["method"]] + ["" if (row["cells"].get(c) or {}).get(what) is None
                                           else f"{row['cells'][c][what]:.4f}"
                                           for c in categories for what in ("speedup", "mean_accepted_tokens")])
    return out.getvalue()
