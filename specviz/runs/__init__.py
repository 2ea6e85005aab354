"""Running configurations: one (`run`), several on one prompt and the k sweep (`compare`), and the
benchmark against transformers' assisted generation (`bench`). All of them go through `run.race`, which
grows a `result.Run`; `recording` saves finished runs and reads them back.

The names below are imported on first use (lazy_loader), so that importing one module of this
package does not import all of them. `run.load` (a model pair) is imported from `runs.run`: the
package's `load` is the load sweep's module (`runs.load`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(__name__, submod_attrs={
    "compare": ["Comparison", "Sweep", "compare", "config_label", "config_labels", "iter_comparison", "iter_sweep",
                "sweep"],
    "prompt_sets": ["PromptSetComparison", "compare_prompt_set", "iter_prompt_set"],
    "result": ["CycleText", "Run"],
    "run": ["Loader", "execute", "last", "load_stepwise", "race"],
})

if TYPE_CHECKING:      # what the names are, for readers and type checkers
    from .compare import Comparison, Sweep, compare, config_label, config_labels, iter_comparison, iter_sweep, sweep
    from .prompt_sets import PromptSetComparison, compare_prompt_set, iter_prompt_set
    from .result import CycleText, Run
    from .run import Loader, execute, last, load_stepwise, race
