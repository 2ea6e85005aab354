"""specviz: speculative decoding on real language models, shown cycle by cycle."""

from .decoding import autoregressive_decode, speculative_decode
from .drafters import Draft, Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model
from .events import Cycle, Step

__all__ = ["speculative_decode", "autoregressive_decode", "Cycle", "Step", "Draft", "Drafter",
           "DraftModelDrafter", "PromptLookupDrafter", "early_exit_model"]
__version__ = "0.1.0"
