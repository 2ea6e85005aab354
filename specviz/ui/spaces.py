"""ZeroGPU on Hugging Face Spaces. `GPU` is `spaces.GPU` when the `spaces` package is installed
(it borrows a GPU for the duration of each call of the function it decorates, and is a no-op on
other hardware); without the package it is a no-op decorator that takes the same arguments."""

from __future__ import annotations

try:
    from spaces import GPU  # noqa: F401  (re-exported)
except ImportError:
    def GPU(fn=None, **_options):
        """No-op stand-in: `@GPU`, `@GPU(duration=120)` and `GPU(fn)` all return the function."""
        if fn is None:
            return lambda function: function
        return fn
