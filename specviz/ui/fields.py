"""Number inputs for the handlers' controls that explain a value of the wrong type.

Gradio checks a slider's or a number field's value against its range before the handler runs, and a
value that is not a number ('abc' through the API) fails that comparison with only Gradio's generic
"upstream application raised an error". These hand such a value to the handler as sent, so that
`settings.validate` names the setting and says what it takes; numbers are checked by Gradio as
before. They are Gradio "templates" (`is_template`): the page draws them as its own slider and number
field. Gradio writes a stub (fields.pyi) beside the module that defines a component class; the stub
ships with it, so nothing is written at import.
"""

from __future__ import annotations

import gradio as gr


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class NumberSlider(gr.Slider):
    """A gr.Slider whose non-numeric values reach the handler."""
    is_template = True

    def preprocess(self, payload):
        return super().preprocess(payload) if _is_number(payload) else payload


class NumberBox(gr.Number):
    """A gr.Number whose non-numeric values reach the handler."""
    is_template = True

    def preprocess(self, payload):
        return super().preprocess(payload) if _is_number(payload) else payload
