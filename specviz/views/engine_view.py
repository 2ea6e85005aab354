"""A load sweep on vLLM or llama.cpp (`runs.engine_load.EngineLoadResult`) -> what the Load tab shows
in place of the own loop's token views: the engine's acceptance by draft position, why there are no
per-token verdicts, and the config to copy (vLLM's speculative config, llama-server's flags). The
speedup, throughput and latency charts and the decision sentence are `views.load_view`'s, unchanged.
"""

from __future__ import annotations

import html
import json

import plotly.graph_objects as go

from ..engines import TITLES
from ..metrics import acceptance_rate_per_position
from ..runs.engine_load import EngineLoadResult
from .charts import layout, waiting
from .figures import config_colour

VERDICTS_NOTE = ("{title} returns no rejected drafts, only how many drafts each request had accepted, so there is no "
                 "token-by-token view here: the chart below is {title}'s own count. Choose specviz's own loop to "
                 "see every draft's verdict.")
NO_VERDICTS = VERDICTS_NOTE.format(title="vLLM")


def _title(result: EngineLoadResult | None) -> str:
    return TITLES[(result.settings.get("engine") if result else None) or "vllm"]


def acceptance_figure(result: EngineLoadResult | None) -> go.Figure:
    """Per k and batch size, the share of vLLM's speculative steps whose draft was accepted at least
    to each position (from vLLM's acceptance histogram)."""
    figure = go.Figure(layout=layout(f"{_title(result)}'s acceptance by draft position", "draft position",
                                     "steps accepted this far", hovermode="closest"))
    points = [p for p in (result.points if result else []) if p.k and getattr(p, "acceptance", None)]
    if not points:
        return waiting(figure, "Run a sweep on vLLM or llama.cpp to see its acceptance by draft position")
    ks = sorted({p.k for p in points})
    for point in points:
        shares = acceptance_rate_per_position(point.acceptance["acceptance_histogram"])
        figure.add_trace(go.Bar(
            x=list(range(1, len(shares) + 1)), y=shares, name=f"k = {point.k}, batch {point.batch}",
            marker=dict(color=config_colour(ks.index(point.k)), opacity=0.45 + 0.55 / point.batch ** 0.5),
            hovertemplate=(f"k = {point.k}, batch {point.batch}, position %{{x}}: %{{y:.0%}} of "
                           f"{point.acceptance['num_spec_steps']} steps<extra></extra>")))
    figure.update_layout(barmode="group", yaxis=dict(range=[0, 1], tickformat=".0%"),
                         xaxis=dict(dtick=1, title=dict(text="draft position")))
    return figure


def config_to_copy(result: EngineLoadResult | None) -> str:
    """The recommendation as the text to paste after vLLM's --speculative-config, or llama-server's
    command line ('' before a point)."""
    if result is None or not any(p.k for p in result.points):
        return ""
    config = result.recommended_speculative_config
    if config is None:
        return "null (speculation paid at no batch size measured)"
    return config["flags"] if result.settings.get("engine") == "llamacpp" else json.dumps(config)


def figures_table(result: EngineLoadResult | None) -> str:
    """Each point's figures beside the one the decision follows: output throughput, TPOT, ITL and
    TTFT of both servers, as `vllm bench serve` reports them."""
    points = result.points if result else []
    if not points:
        return ""
    cells = "".join(
        f"<tr><td>{p.batch}</td><td>{p.k}</td><td>{p.speedup:.2f}\u00d7</td>"
        f"<td>{p.spec_tokens_per_s:.1f} / {p.plain_tokens_per_s:.1f}</td>"
        f"<td>{p.spec_latency * 1000:.0f} / {p.plain_latency * 1000:.0f}</td>"
        f"<td>{p.spec_itl * 1000:.0f} / {p.plain_itl * 1000:.0f}</td>"
        f"<td>{p.spec_ttft * 1000:.0f} / {p.plain_ttft * 1000:.0f}</td><td>{p.requests}</td></tr>" for p in points)
    metric = html.escape(result.settings.get("decision_metric_text", ""))
    return (f'<table class="sv-load-figures" id="load-vllm-figures"><caption>speedup = {metric}, speculative / '
            f'plain; {html.escape(result.settings.get("output_length", ""))}</caption><tr><th>batch</th><th>k</th>'
            "<th>speedup</th><th>output tok/s spec / plain</th><th>TPOT ms</th><th>ITL ms</th><th>TTFT ms</th>"
            f"<th>requests</th></tr>{cells}</table>")


def engine_html(result: EngineLoadResult | None, message: str) -> str:
    """The panel under the decision: what is running, why no verdicts, each point's figures and the
    config to copy."""
    engine = (result.engine if result else {}) or {}
    where = (result.environment.get("device_name") if result else None) or engine.get("device") or "its server"
    title = _title(result)
    head = f"{title} {engine.get('version') or ''} on {where}, {engine.get('dtype', '')}".strip()
    copy = config_to_copy(result)
    what = ("llama-server's flags" if title == "llama.cpp" else "vLLM's <code>--speculative-config</code>")
    config = (f'<div class="sv-load-config"><b>Speculative config to copy</b> ({what}):'
              f'<pre id="load-vllm-config">{html.escape(copy)}</pre></div>' if copy else "")
    name = engine.get("name", "vllm")
    return (f'<div class="sv-load-batch" data-engine="{name}"><div class="sv-load-title">{html.escape(head)}: '
            f'{html.escape(message)}</div><p class="sv-load-note">{html.escape(VERDICTS_NOTE.format(title=title))}</p>'
            f'{figures_table(result)}{config}</div>')
