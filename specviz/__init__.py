"""specviz: speculative decoding on real language models, shown cycle by cycle.

The names below are imported on first use (lazy_loader), so that `import specviz.cli` or
`python -m specviz --help` does not pay for torch and transformers before it needs a model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

from .catalog import VERSION as __version__

__getattr__, __dir__, _names = lazy_loader.attach(__name__, submod_attrs={
    "core.cross_tokenizer": ["CrossTokenizerDrafter"],
    "core.decoding": ["speculative_decode"],
    "core.drafters": ["Draft", "Drafter", "DraftModelDrafter", "PromptLookupDrafter", "early_exit_model"],
    "core.events": ["Cycle", "Step"],
    "core.plain": ["autoregressive_decode"],
})

__all__ = ["__version__", "speculative_decode", "autoregressive_decode", "Cycle", "Step", "Draft", "Drafter",
           "DraftModelDrafter", "PromptLookupDrafter", "CrossTokenizerDrafter", "early_exit_model"]

if TYPE_CHECKING:      # what the names are, for readers and type checkers
    from .core.cross_tokenizer import CrossTokenizerDrafter
    from .core.decoding import speculative_decode
    from .core.drafters import Draft, Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model
    from .core.events import Cycle, Step
    from .core.plain import autoregressive_decode
