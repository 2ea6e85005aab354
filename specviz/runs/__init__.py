"""Running configurations: one (`run`), several on one prompt and the k sweep (`compare`), and the
benchmark against transformers' assisted generation (`bench`). All of them go through `run.race`, which
grows a `result.Run`; `recording` saves finished runs and reads them back."""

from .compare import Comparison, Sweep, compare, config_label, config_labels, iter_comparison, iter_sweep, sweep
from .prompt_sets import PromptSetComparison, compare_prompt_set, iter_prompt_set
from .result import CycleText, Run
from .run import Loader, execute, last, load, load_stepwise, race

__all__ = ["PromptSetComparison", "compare_prompt_set", "iter_prompt_set", "Comparison", "Sweep", "compare",
           "config_label", "config_labels", "iter_comparison", "iter_sweep", "sweep", "CycleText", "Loader", "Run",
           "execute", "last", "load", "load_stepwise", "race"]
