"""A prompt-set comparison shown and saved: the winner sentence (or why there is none), progress with
the time left, the summary and per-category tables, the chart of per-prompt speedups, and the JSON
and CSV records. Pure functions of `runs.PromptSetComparison`; every number comes from it."""

from __future__ import annotations

import json
from pathlib import Path

import plotly.graph_objects as go

from ..clocks import DECODE_ONLY, clock_text, timing
from ..files import write_atomic
from ..runs.prompt_set_result import PromptSetComparison
from .charts import PLAIN_COLOUR, layout
from .figures import config_colour
from .prose import CROSS_TOKENIZER_HEADER     # a column only where a configuration drafts across tokenizers

X = "\u00d7"
# vLLM's two acceptance figures (docs/figures.md); the own loop's tokens per pass counts every pass.
TABLE_HEADERS = ["configuration", "prompts", "median speedup", "95% interval", "acceptance rate", "acceptance length",
                 "tokens per pass"]
ROW_FIELDS = ["config", "prompt_id", "category", "round", "speedup", "tokens", "baseline_tokens", "target_passes",
              "num_drafts", "drafted", "accepted", "seconds", "identical", "draft_model_tokens"]


def winner_line(comparison: PromptSetComparison) -> str:
    """Who won over the prompts, only when the paired interval says so; otherwise what would settle it."""
    order = comparison.ranking()
    summaries = [comparison.summary(i) for i in order]
    if not summaries or not summaries[0].speedups:
        return "No prompt has finished yet."
    best = summaries[0]
    head = (f"{best.label}: median speedup {best.speedup_median:.2f}{X} over {len(best.speedups)} prompts "
            f"(95% interval {best.speedup_ci95[0]:.2f}\u2013{best.speedup_ci95[1]:.2f}{X})")
    if len(summaries) == 1:
        return head + "." + _against_plain(best)
    winner, paired = comparison.winner()
    runner = summaries[1]
    if paired is None:
        return head + f"; {runner.label} has no prompt in common with it yet."
    versus = (f"{paired[0]:.2f}{X} {runner.label}'s speed on the same prompts "
              f"(95% interval {paired[1]:.2f}\u2013{paired[2]:.2f}{X})")
    if winner is not None:
        return f"{best.label} wins: {versus}. " + head + "." + _against_plain(best)
    return (f"No clear winner: {best.label} ran at {versus}, an interval that includes 1. More prompts "
            f"(or --repeats, for timing noise) would settle it. " + head + ".")


def answer_line(comparison: PromptSetComparison) -> str:
    """The question a prompt set answers, answered first: does the best configuration beat plain
    decoding on these prompts? Yes, no, or not settled (its 95% interval includes 1)."""
    summaries = [comparison.summary(i) for i in comparison.ranking()]
    if not summaries or not summaries[0].speedups:
        return "No prompt has finished yet."
    best = summaries[0]
    low, high = best.speedup_ci95
    verdict = "yes" if low > 1.0 else "no" if high < 1.0 else "not settled"
    return f"{best.label} beats plain decoding on these {len(best.speedups)} prompts: {verdict}."


def _against_plain(best) -> str:
    low, high = best.speedup_ci95
    if high < 1.0:
        return " Plain decoding is faster still on these prompts: the winner's interval lies below 1."
    if low <= 1.0:
        return " Whether it beats plain decoding on these prompts is not settled: its interval includes 1."
    return ""


def timing_line(comparison: PromptSetComparison) -> str:
    return (f"Each speedup compares decode-only time per token with plain decoding of the same prompt, timed by "
            f"{clock_text(comparison.clock) if comparison.clock else 'the run clock'}; intervals are 95% bootstrap "
            "intervals over the prompts.")


def progress_line(comparison: PromptSetComparison) -> str:
    left = comparison.seconds_left()
    eta = "" if left is None else f", about {left:.0f} s left"
    return f"{len(comparison.results)} of {comparison.total} runs done{eta}"


def _across_tokenizers(comparison: PromptSetComparison) -> bool:
    return any(r.draft_model_tokens is not None for r in comparison.results)


def table_headers(comparison: PromptSetComparison) -> list[str]:
    """The headers of `table_rows(comparison)`."""
    return TABLE_HEADERS + ([CROSS_TOKENIZER_HEADER] if _across_tokenizers(comparison) else [])


def table_rows(comparison: PromptSetComparison) -> list[list[str]]:
    across = _across_tokenizers(comparison)
    rows = []
    for i in comparison.ranking():
        s = comparison.summary(i)
        if not s.speedups:   # not started yet: no numbers to show, not zeros
            rows.append([s.label, "\u2013", "waiting", "", "", "", ""] + [""] * across)
            continue
        rows.append([s.label, str(len(s.speedups)), f"{s.speedup_median:.2f}{X}",
                     f"{s.speedup_ci95[0]:.2f}\u2013{s.speedup_ci95[1]:.2f}{X}", f"{s.draft_acceptance_rate:.1%}",
                     f"{s.mean_acceptance_length:.2f}",
                     "-" if s.tokens_per_cycle is None else f"{s.tokens_per_cycle:.2f}"])
        if across:
            per_token = s.draft_tokens_per_target_token
            rows[-1].append("" if per_token is None else f"{per_token:.2f}")
    return rows


def category_rows(comparison: PromptSetComparison) -> tuple[list[str], list[list[str]]]:
    """(headers, rows): the median speedup of each configuration in each category."""
    summaries = [comparison.summary(i) for i in range(len(comparison.configs))]
    categories = list(dict.fromkeys(p.category for p in comparison.prompts))
    rows = [[category] + [f"{s.by_category[category]:.2f}{X}" if category in s.by_category else "" for s in summaries]
            for category in categories]
    return ["category"] + [s.label for s in summaries], rows


def speedups_figure(comparison: PromptSetComparison) -> go.Figure:
    """Each prompt's speedup per configuration (points), the median (a bar across) and its interval."""
    traces = []
    for i in range(len(comparison.configs)):
        s = comparison.summary(i)
        colour = config_colour(i)
        traces.append(go.Scatter(x=[s.label] * len(s.speedups), y=s.speedups, mode="markers", name=s.label,
                                 marker=dict(color=colour, size=8, opacity=0.6), showlegend=False,
                                 hovertemplate=f"{s.label}: %{{y:.2f}}{X}<extra></extra>"))
        if s.speedups:
            low, high = s.speedup_ci95
            traces.append(go.Scatter(
                x=[s.label], y=[s.speedup_median], mode="markers", name=f"{s.label} median",
                marker=dict(symbol="line-ew-open", size=36, color=colour, line=dict(width=4)), showlegend=False,
                error_y=dict(type="data", symmetric=False, array=[high - s.speedup_median],
                             arrayminus=[s.speedup_median - low], color=colour, thickness=2, width=14),
                hovertemplate=f"median %{{y:.2f}}{X} (95% interval {low:.2f}\u2013{high:.2f}{X})<extra></extra>"))
    fig_layout = layout("Speedup on each prompt, median and 95% interval", None, f"speedup {X}", hovermode="closest",
                        height=340, yaxis=dict(title=f"speedup {X}", rangemode="tozero",
                                               gridcolor="rgba(128,128,128,0.25)"))
    fig_layout["shapes"] = [dict(type="line", xref="paper", x0=0, x1=1, y0=1, y1=1,
                                 line=dict(color=PLAIN_COLOUR, width=1, dash="dot"))]
    return go.Figure(traces, layout=fig_layout)


def rows(comparison: PromptSetComparison) -> list[dict]:
    """One flat record per configuration, prompt and round (ROW_FIELDS)."""
    out = []
    for r in comparison.results:
        prompt = comparison.prompts[r.prompt]
        out.append(dict(config=comparison.labels[r.config], prompt_id=prompt.id, category=prompt.category,
                        round=r.round, speedup=r.speedup, tokens=r.tokens, baseline_tokens=r.baseline_tokens,
                        target_passes=r.passes, num_drafts=r.num_drafts, drafted=r.drafted, accepted=r.accepted,
                        seconds=r.seconds,
                        identical=r.identical, draft_model_tokens=r.draft_model_tokens))
    return out


def summary(comparison: PromptSetComparison) -> dict:
    """The JSON summary: per configuration its median speedup and interval, and the winner (or null)."""
    winner, paired = comparison.winner()
    configurations = []
    for i, settings in enumerate(comparison.configs):
        s = comparison.summary(i)
        configurations.append({"config": s.label, "settings": settings.to_dict(), "prompts": len(s.speedups),
                               "speedup_median": s.speedup_median, "speedup_ci95": list(s.speedup_ci95),
                               "mean_acceptance_length": s.mean_acceptance_length,
                               "draft_acceptance_rate": s.draft_acceptance_rate, "tokens_per_cycle": s.tokens_per_cycle,
                               "by_category": s.by_category,
                               "draft_tokens_per_target_token": s.draft_tokens_per_target_token})
    return {"prompts": len(comparison.prompts), "repeats": comparison.repeats, "configurations": configurations,
            "winner": None if winner is None else comparison.labels[winner],
            "paired": None if paired is None else {"ratio": paired[0], "ci95": [paired[1], paired[2]]},
            "winner_line": winner_line(comparison), "compared": "decode-only seconds per token, per prompt",
            "clock": comparison.clock, "timing": timing(comparison.clock, speedup=DECODE_ONLY)}


def json_text(comparison: PromptSetComparison) -> str:
    """The summary and the per-prompt rows as JSON text (the command line writes it whole)."""
    return json.dumps(dict(summary(comparison), rows=rows(comparison)), indent=2, ensure_ascii=False)


def write_files(comparison: PromptSetComparison, directory: Path) -> list[Path]:
    """rows.csv (one plain value per cell), summary.json and charts.html in `directory`."""
    from .export import charts_html, csv_text

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    cells = [{k: "" if v is None else v for k, v in row.items()} for row in rows(comparison)]
    return [write_atomic(directory / "rows.csv", csv_text(ROW_FIELDS, cells)),
            write_atomic(directory / "summary.json", json.dumps(summary(comparison), indent=2, ensure_ascii=False)),
            write_atomic(directory / "charts.html", charts_html({"speedups": speedups_figure(comparison)}))]
