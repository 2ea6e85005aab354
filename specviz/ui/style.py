"""The app's look, in one place: the stylesheet (the token view's from `views.render`, then the
app's and the tabs'), the theme, and the two small scripts behind Large text and Light / dark."""

from __future__ import annotations

import gradio as gr

from ..views import render

CSS = render.CSS + """
#sv-title h1 { margin-bottom: 0; }
#sv-toolbar { gap: 6px; }
#examples .sv-example, #examples button { font-size: var(--text-sm); }
.sv-stopped { border: 2px solid #E69F00; border-radius: 8px; padding: 6px 10px; margin-bottom: 6px; }
.sv-state { opacity: 0.8; }
.dark .js-plotly-plot .main-svg text { fill: #e4e4e7 !important; }
.dark .js-plotly-plot .main-svg .gridlayer path { stroke: rgba(200,200,200,0.2) !important; }
.dark .js-plotly-plot .hoverlayer text { fill: #222 !important; }
body.sv-large .gradio-container { zoom: 1.25; }
body.sv-large .sv-text { font-size: 1.2em; }
.sv-teach table { font-size: 0.95em; }
.sv-teach code, .sv-compare code { font-family: var(--font-mono, ui-monospace, monospace); }
.sv-id { opacity: 0.6; font-size: 0.85em; }
.sv-cycle.sv-current { outline: 2px solid #0072B2; outline-offset: 2px; border-radius: 3px; }
.sv-teach tr.sv-current-row { outline: 2px solid #0072B2; outline-offset: -2px; }
.sv-not-yet { opacity: 0.6; font-style: italic; }
.sv-prompt { opacity: 0.7; }
.sv-explain ol { margin: 8px 0 0 1.2em; }
.sv-winner { font-size: 1.15em; font-weight: 600; }
.sv-compare .sv-text { max-height: 22em; }
"""

# Plotly sizes its charts on window resize events: send one after the zoom changes.
LARGE_TEXT_JS = ("(on) => { document.body.classList.toggle('sv-large', on); "
                 "setTimeout(() => window.dispatchEvent(new Event('resize')), 50); return on; }")
DARK_JS = "() => { document.body.classList.toggle('dark'); }"


def theme() -> gr.themes.Base:
    """A plain theme with strong contrast that reads from the back of a room."""
    return gr.themes.Default(primary_hue="blue", neutral_hue="slate", text_size="lg", radius_size="sm")
