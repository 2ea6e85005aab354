"""specviz: speculative decoding on real language models, shown cycle by cycle."""

from .catalog import VERSION as __version__
from .core.cross_tokenizer import CrossTokenizerDrafter
from .core.decoding import speculative_decode
from .core.plain import autoregressive_decode
from .core.drafters import Draft, Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model
from .core.events import Cycle, Step

__all__ = ["__version__", "speculative_decode", "autoregressive_decode", "Cycle", "Step", "Draft", "Drafter",
           "DraftModelDrafter", "PromptLookupDrafter", "CrossTokenizerDrafter", "early_exit_model"]
