"""Several configurations on one prompt, and the k sweep: `python -m specviz compare`.

A comparison runs 2 to 4 configurations (target, drafter, k or dynamic k, temperature) one after
another on the same device, each against one plain-decoding baseline: configurations that share
the target and the sampling settings share one baseline run (a configuration with another target
or other sampling settings gets its own). A k sweep is a comparison of one configuration with
itself at k = 1..8, read against the theory's speedup curve for the acceptance and cost ratio it
measured.

Runs go through `runs.execute`, so each configuration is timed exactly as `run` times it. The
library streams: `iter_comparison` and `iter_sweep` yield the results so far after each
configuration; `compare` and `sweep` drain them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from .metrics import best_k, expected_speedup
from .runs import RunConfig, RunFailed, RunResult, execute

SWEEP_KS = tuple(range(1, 9))
Load = Callable[[RunConfig], object]              # config -> a ModelPair (or a stand-in)
Progress = Callable[[float, str], None]


# ----------------------------------------------------------------------------- labels

def config_label(config: RunConfig, *, with_target: bool = False) -> str:
    """A short name for a configuration: 'self:24 k=4', 'ngram k=4..8 (dynamic)', '... T=0.7'."""
    draft = config.draft or "ngram"
    if config.dynamic_k:
        k = f"k={config.k}..{config.max_k or 2 * config.k} (dynamic)"
    else:
        k = f"k={config.k}"
    parts = [draft, k]
    if config.temperature > 0:
        parts.append(f"T={config.temperature:g}")
    if with_target:
        parts.insert(0, (config.target or "default") + ":")
    return " ".join(parts)


def config_labels(configs: Sequence[RunConfig]) -> list[str]:
    """Distinct labels for a list of configurations (the target named only when they differ)."""
    with_target = len({c.target for c in configs}) > 1
    labels: list[str] = []
    for config in configs:
        label = config_label(config, with_target=with_target)
        if label in labels:
            label += f" #{sum(existing.startswith(label) for existing in labels) + 1}"
        labels.append(label)
    return labels


def baseline_key(config: RunConfig) -> tuple:
    """Configurations with equal keys can share one plain-decoding run: same model, same prompt
    encoding, same sampling rule (the baseline of a greedy run must be greedy to compare outputs)."""
    return (config.target, config.dtype, config.device, config.chat, config.max_new_tokens,
            config.temperature, config.top_k, config.top_p, config.seed)


# ----------------------------------------------------------------------------- comparison

@dataclass
class Comparison:
    prompt: str
    configs: list[RunConfig]
    labels: list[str]
    results: list[RunResult]       # the finished ones, in order; each carries its baseline's steps

    @property
    def done(self) -> bool:
        return len(self.results) == len(self.configs)

    def pairs(self) -> list[tuple[str, RunResult]]:
        return list(zip(self.labels, self.results))

    def baselines(self) -> list[RunResult]:
        """One result per distinct baseline run (the first configuration that used it)."""
        seen, firsts = set(), []
        for result in self.results:
            if result.steps and id(result.steps) not in seen:
                seen.add(id(result.steps))
                firsts.append(result)
        return firsts


def iter_comparison(configs: Sequence[RunConfig], prompt: str, *, load: Load | None = None,
                    progress: Progress | None = None) -> Iterator[Comparison]:
    """Run each configuration in turn; yield the comparison so far after each one. The first
    configuration of each baseline key also runs the plain baseline (after a short warm-up, as
    `execute` does); the others reuse its steps."""
    configs = list(configs)
    if not configs:
        raise RunFailed("nothing to compare: give at least one configuration")
    if load is None:
        from .runs import load
    comparison = Comparison(prompt, configs, config_labels(configs), [])
    baselines: dict[tuple, RunResult] = {}
    for i, config in enumerate(configs):
        label = comparison.labels[i]
        report = _span(progress, i / len(configs), (i + 1) / len(configs))
        pair = load(config)
        key = baseline_key(config)
        shared = baselines.get(key)
        _report(report, 0.2, f"[{i + 1}/{len(configs)}] {label}: decoding"
                + ("" if shared else " (and the plain baseline)"))
        result = execute(config, prompt, baseline=shared is None, pair=pair)
        if shared is None:
            baselines[key] = result
        else:  # attach the shared baseline, as execute(baseline=True) would have
            result.steps, result.plain, result.baseline_text = shared.steps, shared.plain, shared.baseline_text
        comparison.results.append(result)
        _report(report, 1.0, f"[{i + 1}/{len(configs)}] {label}: {result.stats.tokens} tokens, "
                f"{result.speedup:.2f}x")
        yield comparison


def compare(configs: Sequence[RunConfig], prompt: str, **options) -> Comparison:
    comparison = None
    for comparison in iter_comparison(configs, prompt, **options):
        pass
    return comparison


def _report(progress: Progress | None, fraction: float, message: str) -> None:
    if progress is not None:
        progress(fraction, message)


def _span(progress: Progress | None, start: float, end: float) -> Progress | None:
    if progress is None:
        return None
    return lambda fraction, message: progress(start + (end - start) * fraction, message)


# ----------------------------------------------------------------------------- reading it

def baseline_labels(comparison: Comparison) -> list[tuple[str, RunResult]]:
    """Each plain baseline with a name that tells it apart from the others (by target, then by
    sampling settings), and the first result that ran it."""
    firsts = comparison.baselines()
    many_targets = len({r.target_name for r in firsts}) > 1
    named = []
    for result in firsts:
        details = [result.target_name] if many_targets else []
        if len(firsts) > len({r.target_name for r in firsts}):   # same target, other sampling settings
            c = result.config
            details.append("greedy" if c.temperature == 0 else f"T={c.temperature:g}")
        named.append(("plain decoding" + (f" ({', '.join(details)})" if details else ""), result))
    return named


def ranked(comparison: Comparison) -> list[tuple[str, RunResult]]:
    """Finished configurations, fastest first (measured speedup)."""
    return sorted(comparison.pairs(), key=lambda pair: pair[1].speedup or 0.0, reverse=True)


def draft_cost(result: RunResult) -> float:
    """Drafting time per cycle in target passes: k c, the term the theory divides by (1 + k c)."""
    return result.stats.mean_k * result.stats.cost_ratio


def pass_seconds(result: RunResult) -> float:
    """Mean time of one verification pass, leaving out the first (it carries the prompt's prefill)."""
    steady = result.cycles[1:] or result.cycles
    return sum(c.verify_seconds for c in steady) / len(steady) if steady else 0.0


def drafted_per_cycle(result: RunResult) -> float:
    return result.stats.drafted / result.stats.cycles if result.stats.cycles else 0.0


def winner_line(comparison: Comparison) -> str:
    """One sentence: which configuration was fastest, and why: more tokens per target pass
    (acceptance), cheaper drafting (k c), or cheaper target passes (verifying fewer tokens)."""
    order = ranked(comparison)
    if not order:
        return "No configuration has finished yet."
    (label, best) = order[0]
    if len(order) == 1:
        return f"{label}: {best.speedup:.2f}\u00d7 over plain decoding."
    runner_label, runner = order[1]
    head = (f"{label} won: {best.speedup:.2f}\u00d7 over plain decoding against {runner.speedup:.2f}\u00d7 "
            f"for {runner_label}")
    if best.speedup < 1.0:
        head = (f"No configuration beat plain decoding; {label} came closest: {best.speedup:.2f}\u00d7 against "
                f"{runner.speedup:.2f}\u00d7 for {runner_label}")
    # Each factor: (name, winner's value, runner-up's value, clearly better, clearly worse, text).
    a, b = best.stats.mean_acceptance_length, runner.stats.mean_acceptance_length
    d, e = draft_cost(best), draft_cost(runner)
    v, w = pass_seconds(best), pass_seconds(runner)
    factors = [
        ("acceptance", a > 1.05 * b, b > 1.05 * a, f"{a:.2f} tokens per target pass against {b:.2f}"),
        ("draft cost", d < e - 0.05, d > e + 0.05,
         f"drafting costs {d:.2f} of a target pass per cycle against {e:.2f}"),
        ("verification cost", v < 0.9 * w, w < 0.9 * v,
         f"a target pass took {1000 * v:.0f} ms against {1000 * w:.0f} ms"),
    ]
    # A pass verifies the drafted tokens: fewer of them is the one reason for cheaper passes.
    n, m = drafted_per_cycle(best), drafted_per_cycle(runner)
    if v < 0.9 * w:
        factors[2] = factors[2][:3] + (factors[2][3] + (f", verifying {n:.1f} drafted tokens against {m:.1f}" if n < m
                                                        else ", although it verified as many drafted tokens or more "
                                                             "(timing noise?)"),)
    better = [f for f in factors if f[1]]
    worse = [f for f in factors if f[2]]
    if better:
        why = (f"on {' and '.join(f[0] for f in better)}: " + "; ".join(f[3] for f in better)
               + (", although " + "; ".join(f[3] for f in worse) if worse else ""))
    elif worse:
        # Behind on some count and ahead on none: the clock disagrees with the counts.
        why = ("although " + "; ".join(f[3] for f in worse) + ": the timings contradict the counts, so the "
               "machine was probably busy during one of the runs; run it again")
    else:
        why = ("with similar acceptance, draft cost and verification cost: a margin this small can be timing noise")
    return f"{head}, {why}."


TABLE_HEADERS = ["configuration", "accepted", "per pass", "c", "speedup", "theory", "tokens/s"]


def table_rows(comparison: Comparison) -> list[list[str]]:
    """The summary table as text cells (headers: TABLE_HEADERS): one row per configuration, then
    one per plain baseline. accepted: the draft acceptance rate; speedup: measured against the
    configuration's baseline; theory: the expected speedup at the measured alpha, mean k and c."""
    rows = []
    for label, result in comparison.pairs():
        s = result.stats
        rows.append([label, f"{s.draft_acceptance_rate:.1%}", f"{s.mean_acceptance_length:.2f}",
                     f"{s.cost_ratio:.3f}", f"{result.speedup:.2f}\u00d7", f"{s.expected_speedup:.2f}\u00d7",
                     f"{s.tokens_per_second:.1f}"])
    for name, result in baseline_labels(comparison):
        rows.append([name, "", "1.00", "", "1.00\u00d7", "", f"{result.plain.tokens_per_second:.1f}"])
    return rows


def identity_line(comparison: Comparison) -> str:
    """Whether the greedy configurations wrote exactly the plain greedy output ("" if none is greedy)."""
    greedy = [(label, r) for label, r in comparison.pairs() if r.config.temperature == 0 and r.steps]
    if not greedy:
        return ""
    differ = [f"{label} from token {r.divergence}" for label, r in greedy if not r.identical]
    if not differ:
        return f"Greedy outputs: identical to plain decoding's ({len(greedy)} of {len(greedy)})."
    return ("Greedy outputs: " + "; ".join(differ) + " differs from plain decoding's (reduced precision such as "
            "bfloat16 can flip near-tied logits; float32 gives exact equality).")


# ----------------------------------------------------------------------------- k sweep

@dataclass
class Sweep:
    comparison: Comparison          # one configuration per k
    ks: list[int]

    @property
    def points(self) -> list[tuple[int, RunResult]]:
        return list(zip(self.ks, self.comparison.results))

    @property
    def alpha(self) -> float:
        """Acceptance pooled over every k: accepted / (accepted + rejections), as in metrics."""
        accepted = sum(r.stats.accepted for _, r in self.points)
        rejections = sum(1 for _, r in self.points for c in r.cycles if c.num_accepted < len(c.drafted))
        return accepted / (accepted + rejections) if accepted + rejections else 0.0

    @property
    def cost_ratio(self) -> float:
        """c: the median of the runs' own measurements (each is noisy; the drafter is the same)."""
        values = sorted(r.stats.cost_ratio for _, r in self.points)
        if not values:
            return 0.0
        middle = len(values) // 2
        return values[middle] if len(values) % 2 else (values[middle - 1] + values[middle]) / 2

    def theory(self, k: int) -> float:
        return expected_speedup(self.alpha, k, self.cost_ratio)

    @property
    def best_measured_k(self) -> int | None:
        points = [(r.speedup or 0.0, k) for k, r in self.points]
        return max(points)[1] if points else None

    @property
    def best_theory_k(self) -> int:
        return best_k(self.alpha, self.cost_ratio, max_k=max(self.ks))

    def rows(self) -> list[list[str]]:
        """One row per k (headers: SWEEP_HEADERS); theory is at the pooled alpha and median c."""
        return [[str(k), f"{r.stats.draft_acceptance_rate:.1%}", f"{r.stats.mean_acceptance_length:.2f}",
                 f"{r.stats.cost_ratio:.3f}", f"{r.speedup:.2f}\u00d7", f"{self.theory(k):.2f}\u00d7",
                 f"{r.stats.tokens_per_second:.1f}"] for k, r in self.points]

    def line(self) -> str:
        if not self.points:
            return "No k has finished yet."
        k = self.best_measured_k
        measured = dict(self.points)[k].speedup
        return (f"Best measured k = {k} ({measured:.2f}\u00d7); the theory, at the measured \u03b1 = {self.alpha:.2f} "
                f"and c = {self.cost_ratio:.3f}, puts the best k at {self.best_theory_k} "
                f"({self.theory(self.best_theory_k):.2f}\u00d7).")


SWEEP_HEADERS = ["k", "accepted", "per pass", "c", "speedup", "theory", "tokens/s"]


def iter_sweep(config: RunConfig, prompt: str, ks: Iterable[int] = SWEEP_KS, **options) -> Iterator[Sweep]:
    """`config` at each k (fixed k: dynamic k is turned off), against one shared baseline."""
    ks = list(ks)
    configs = [replace(config, k=k, dynamic_k=False, max_k=None) for k in ks]
    for comparison in iter_comparison(configs, prompt, **options):
        yield Sweep(comparison, ks)


def sweep(config: RunConfig, prompt: str, ks: Iterable[int] = SWEEP_KS, **options) -> Sweep:
    result = None
    for result in iter_sweep(config, prompt, ks, **options):
        pass
    return result


# ----------------------------------------------------------------------------- command line

def add_arguments(parser: argparse.ArgumentParser) -> None:
    from .cli import add_decoding_arguments, add_model_arguments

    add_model_arguments(parser, draft_repeatable=True)
    add_decoding_arguments(parser)
    parser.add_argument("--sweep", action="store_true", help="run one drafter at k = 1..8 instead (one --draft)")
    parser.add_argument("--export", type=Path, default=None, metavar="DIR",
                        help="write cycles.jsonl, cycles.csv, summary.json and the charts (HTML, and PNG "
                             "when kaleido can find a Chrome) to DIR")
    parser.add_argument("--no-png", action="store_true", help="with --export: HTML charts only (PNG takes seconds)")
    parser.add_argument("--no-color", action="store_true", help="plain text output")
    parser.add_argument("prompt", help="the prompt")


def rich_table(title: str, headers: Sequence[str], rows: Sequence[Sequence[str]]):
    from rich.table import Table

    from rich import box

    table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD)
    for i, header in enumerate(headers):
        table.add_column(header, justify="right" if i else "left", no_wrap=not i)
    for row in rows:
        table.add_row(*row)
    return table


def main(args: argparse.Namespace) -> int:
    from rich.console import Console

    from .cli import fail, progress_printer

    drafts = args.draft or ["ngram"]
    if args.sweep and len(drafts) > 1:
        return fail("--sweep runs one configuration over k = 1..8: give one --draft")
    configs = [RunConfig.from_args(args, draft=draft) for draft in drafts]
    console = Console(no_color=args.no_color, highlight=False)
    progress = progress_printer(quiet=False)
    try:
        if args.sweep:
            result = sweep(configs[0], args.prompt, progress=progress)
            comparison = result.comparison
        else:
            result, comparison = None, compare(configs, args.prompt, progress=progress)
    except RunFailed as exc:
        return fail(str(exc))
    except KeyboardInterrupt:
        return fail("cancelled", 130)

    first = comparison.results[0]
    console.print(f"{first.target_name}, {first.prompt_tokens} prompt tokens, "
                  f"up to {first.config.max_new_tokens} new tokens")
    if result is None:
        console.print(rich_table("Against plain decoding", TABLE_HEADERS, table_rows(comparison)))
        console.print(winner_line(comparison))
    else:
        title = f"k sweep of {configs[0].draft or 'ngram'} (theory at the pooled \u03b1 and median c)"
        console.print(rich_table(title, SWEEP_HEADERS, result.rows()))
        console.print(f"plain decoding: {first.plain.tokens_per_second:.1f} tokens/s")
        console.print(result.line())
    if identity_line(comparison):
        console.print(identity_line(comparison))
    if args.export:
        from . import export, figures_compare

        figures = figures_compare.comparison_figures(comparison)
        if result is not None:
            figures["k_sweep"] = figures_compare.sweep_figure(result)
        written, note = export.export_comparison(comparison, args.export, figures=figures, sweep=result,
                                                  png=not args.no_png)
        console.print(f"wrote {len(written)} files to {args.export}" + (f" ({note})" if note else ""))
    return 0

