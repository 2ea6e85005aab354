"""Running configurations: one (`run`), several on one prompt and the k sweep (`compare`), and the
benchmark against transformers' assisted generation (`bench`). All of them go through `run.race`, which
grows a `result.Run`; `recording` saves finished runs and reads them back.

The names below are imported on first use (lazy_loader), so that importing one module of this
package does not import all of them. A name that is also a module's here is not exported (the module
would shadow it as soon as it is imported): the pair `settings` name is loaded by `load_models`
(`runs.run.load`; `runs.load` is the load sweep), and `runs.compare.compare` is imported from its module.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "compare": ["iter_comparison", "iter_sweep", "sweep"],
    "comparison": ["Comparison", "Sweep", "config_label", "config_labels"],
    "prompt_set_result": ["PromptSetComparison"],
    "prompt_sets": ["compare_prompt_set", "iter_prompt_set"],
    "result": ["CycleText", "Run"],
    "run": ["Loader", "execute", "last", "load_models", "load_stepwise", "race"],
})

if TYPE_CHECKING:      # what the names are, for readers and type checkers
    from .compare import iter_comparison, iter_sweep, sweep
    from .comparison import Comparison, Sweep, config_label, config_labels
    from .prompt_set_result import PromptSetComparison
    from .prompt_sets import compare_prompt_set, iter_prompt_set
    from .result import CycleText, Run
    from .run import Loader, execute, last, load_models, load_stepwise, race
