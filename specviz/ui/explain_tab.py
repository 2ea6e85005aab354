"""The Explain tab: how speculative decoding works, one cycle drawn, and the theory's formulas filled
with the last Compare or Teach run's numbers (through the shared `last_run` state) or with numbers
set on the sliders. Content from `views.explain`; nothing here runs a model."""

from __future__ import annotations

from typing import NamedTuple

import gradio as gr

from ..errors import SpecvizError
from ..settings import number, whole_number
from ..views import explain


class ExplainTab(NamedTuple):
    formulas: gr.Markdown
    figure: gr.Plot
    alpha: gr.Slider
    k: gr.Slider
    c: gr.Slider


def on_numbers(alpha, k, c):
    """The formulas and the curve for numbers set on the sliders."""
    try:
        alpha, k, c = number("\u03b1", alpha, 0, 0.99), whole_number("k", k, 1, 16), number("c", c, 0, 1)
    except SpecvizError as exc:
        gr.Warning(str(exc))
        return gr.skip(), gr.skip()
    return explain.formulas_markdown(alpha=alpha, k=k, c=c), explain.theory_figure(alpha, c, label="these numbers")


def build_explain_tab(last_run: gr.State | None = None) -> ExplainTab:
    """The explanation, its formulas filled with the last run's numbers (from `last_run`, when
    given) or with numbers typed into the sliders."""
    gr.Markdown("## One cycle, drawn")
    gr.HTML(explain.illustration_html(), elem_id="explain-illustration")
    gr.Markdown(explain.EXPLAIN_INTRO, latex_delimiters=explain.LATEX_DELIMITERS, elem_id="explain-text")
    gr.Markdown("## The formulas, with numbers")
    text, figure, *_ = explain.explain_outputs(None)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3):
            formulas = gr.Markdown(text, latex_delimiters=explain.LATEX_DELIMITERS, elem_id="explain-formulas")
        with gr.Column(scale=2):
            plot = gr.Plot(figure, show_label=False, elem_id="explain-chart")
    example = explain.EXAMPLE_NUMBERS
    with gr.Row():
        alpha = gr.Slider(0.0, 0.99, value=example["alpha"], step=0.01, label="\u03b1 (acceptance)")
        k = gr.Slider(1, 16, value=example["k"], step=1, label="k")
        c = gr.Slider(0.0, 1.0, value=example["c"], step=0.005, label="c (draft cost / target pass)")

    private = dict(queue=False, api_visibility="private")
    for slider in (alpha, k, c):
        slider.release(on_numbers, [alpha, k, c], [formulas, plot], **private)
    if last_run is not None:
        last_run.change(explain.explain_outputs, last_run, [formulas, plot, alpha, k, c], **private)
    return ExplainTab(formulas, plot, alpha, k, c)
