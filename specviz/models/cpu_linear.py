"""Few-row products on a CPU, in the orientation this CPU computes fastest.

A decoding step multiplies one row of activations by every weight matrix; a verification pass, a few
rows (the drafted tokens and one more). At batch 1 both are bound by reading the weights from memory,
so a pass over 2-5 rows should cost about one step. With PyTorch's CPU build here (float32, one
thread, MKL) it did not: `F.linear(x, W)` on 2 rows took 2.5 times its 1-row time on the 49152 x 576
output layer of the built-in model (24.9 ms against 10.1 ms), and a whole pass over 2 drafted tokens
1.64 plain steps. The same product computed as `W @ x.T` (then transposed back) took 6.2 ms: the
library takes a different path for a tall matrix times a thin one. Which is faster depends on the
shape, the row count and the CPU, so it is measured, not assumed.

Two details decide whether that holds in a whole pass, not just in one product. The product comes back
transposed (column-major); handed on as it is, it slowed what read it next: the MLP's down projection of
a 2-row pass took 31.5 ms of a pass where it takes 7.5 ms for one row (its input, the gate times the up
projection, inherited the layout), and attention read the query in that layout too; so the output is
made contiguous (a copy of rows x out values). And one row alone takes the library's matrix-vector path
in either orientation, slower here than its matrix-matrix path for two rows: a 1-row input is computed
as two (the row twice, the first column kept) where that measured faster, which is then what a plain
decoding step runs on (after 800 tokens, a plain step 0.81 of its time before; a pass over 1 drafted
token 0.97 of a plain step's time before, where it took 1.50).

`orient_linears(model)` times both orientations on the model's own weights (every layer of one
shape in turn, so that they come from memory as in a pass, not from cache), for each row count up to
MAX_ROWS, in interleaved rounds on the run's clock, and makes each `nn.Linear` an `OrientedLinear`
that uses `W @ x.T` for the row counts where it measured at least FASTER faster. Prefills and wide
passes (more rows) stay as they were. Every product is the same matrix product either way: the
values agree to float32 rounding (which differs between any two kernels, as between a 1-row step
and a pass today), and plain decoding and speculation run on the same model, so both get whichever
is faster for the rows they compute: the comparison stays one of equal work on one model.

Only for float32 weights on a CPU (measured there); a GPU, half precision and quantized layers are
left alone."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn

from ..core.timing import Clock, interleaved_seconds

MAX_ROWS = 9            # row counts timed: 1 to this (a pass over up to 8 drafted tokens)
FASTER = 0.95           # `W @ x.T` is used where it took at most this share of `F.linear`'s time
ROUNDS = 2              # interleaved rounds per row count (medians), after one untimed
STOP_AFTER_LOSSES = 2   # past 2 rows, a shape stops being timed once `W @ x.T` lost this many row counts in a row


class OrientedLinear(nn.Linear):
    """`nn.Linear` computing inputs of `transposed_rows` rows as `weight @ x.T` (`transposed_product`: a
    contiguous result, one row as two; see the module docstring); any other input as `F.linear` does."""

    transposed_rows: frozenset[int] = frozenset()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = x.shape[-1]
        rows = x.numel() // features if features else 0
        if rows not in self.transposed_rows:
            return F.linear(x, self.weight, self.bias)
        out = transposed_product(self.weight, x.reshape(rows, features))
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)


def transposed_product(weight: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """`rows @ weight.T` as `weight @ rows.T`, contiguous; one row computed as two (module docstring)."""
    fed = rows if rows.shape[0] > 1 else torch.cat([rows, rows])
    return torch.mm(weight, fed.t())[:, :rows.shape[0]].t().contiguous()


def orientable(module: nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (type(module) in (nn.Linear, OrientedLinear) and weight is not None and weight.dtype == torch.float32
            and weight.device.type == "cpu" and weight.dim() == 2)


def orient_linears(model: nn.Module, max_rows: int = MAX_ROWS,
                   rounds: int = ROUNDS) -> dict[tuple[int, int], list[int]]:
    """Measure and set each float32 CPU `nn.Linear`'s orientation by row count (module docstring).
    Once per model (a second call returns what the first chose). Returns, by weight shape (out, in),
    the row counts computed as `W @ x.T`."""
    chosen = getattr(model, "_specviz_oriented", None)
    if chosen is not None:
        return chosen
    groups: dict[tuple[int, int], list[nn.Linear]] = defaultdict(list)
    for module in model.modules():
        if orientable(module):
            groups[tuple(module.weight.shape)].append(module)
    clock = Clock(torch.device("cpu"))
    chosen = {}
    with torch.inference_mode():
        for shape, modules in groups.items():
            weights = [module.weight for module in modules]
            rows_transposed, losses = [], 0
            for rows in range(1, max_rows + 1):
                if rows > 2 and losses >= STOP_AFTER_LOSSES:     # it wins over a range of few rows, or not at all
                    break
                x = torch.randn(rows, shape[1])

                def as_linear(x=x, weights=weights):
                    for weight in weights:
                        F.linear(x, weight)

                def as_transposed(x=x, weights=weights):
                    for weight in weights:
                        transposed_product(weight, x)

                linear, transposed = interleaved_seconds([as_linear, as_transposed], clock, rounds)
                if transposed <= FASTER * linear:
                    rows_transposed.append(rows)
                    losses = 0
                else:
                    losses += 1
            chosen[shape] = rows_transposed
            for module in modules:
                module.__class__ = OrientedLinear
                module.transposed_rows = frozenset(rows_transposed)
    model._specviz_oriented = chosen
    return chosen


def unorient_linears(model: nn.Module) -> None:
    """Every `OrientedLinear` an `nn.Linear` again (tests, comparisons with the stock layers)."""
    for module in model.modules():
        if type(module) is OrientedLinear:
            module.__class__ = nn.Linear
            module.__dict__.pop("transposed_rows", None)
    model.__dict__.pop("_specviz_oriented", None)
