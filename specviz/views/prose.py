"""Runs and comparisons in words: the lines the command line prints and the app shows (summary lines,
the speedup with its range and clock, the winner sentence, table cells). Pure functions of `Run`,
`Comparison` and `Sweep`; every number comes from `metrics`."""

from __future__ import annotations

from collections.abc import Sequence

from ..clocks import clock_text, elapsed_text, timed
from ..metrics import draft_cost, drafted_per_cycle, ideal_speedup, pass_seconds
from ..runs.comparison import Comparison, Sweep, ranked
from ..runs.result import Run
from .compared_prose import compared_text, float32_advice, no_speed_text, parted_text
from .drafter_marks import drafter_word

X = "\u00d7"


def cost_ratio_text(run: Run) -> str:
    """c, with a meaning for a drafter that runs no model (prompt lookup costs next to nothing)."""
    c = run.stats.cost_ratio
    if run.draft_parameters == 0 and c < 0.001:
        return "< 0.001 (prompt lookup runs no model)"
    return f"{c:.3f}"


def speed_text(run: Run) -> str:
    """'2.31x (thread CPU time), 95% range 2.10-2.52x', or why there is no trustworthy figure yet."""
    speed = run.speed
    if speed is None:
        return no_speed_text(run)
    figure = f"{timed(f'{speed.speedup:.2f}{X}', run.clock)}, 95% range {speed.low:.2f}\u2013{speed.high:.2f}{X}"
    if not speed.reliable:
        return figure + ": too short to measure reliably"
    return figure


def speedup_headline(run: Run) -> tuple[str, str]:
    """The speedup as the summary shows it: (the large figure, the headline sentence naming the clock
    that timed it, and the run's elapsed wall time). The app's summary and the exported animations
    both say it with these words."""
    speed = run.speed
    elapsed = "" if run.elapsed_wall_seconds is None else f"; {elapsed_text(run.elapsed_wall_seconds)}"
    if speed is None:
        return "\u2026", f"Measured speedup: {no_speed_text(run)}{elapsed}"
    figure = f"{speed.speedup:.2f}{X}"
    interval = f"(95% range {speed.low:.2f}\u2013{speed.high:.2f}{X})"
    if not speed.reliable:
        return (f"~{figure}", f"Measured speedup about {timed(figure, run.clock)} {interval}: too short to measure "
                f"reliably{elapsed}")
    return figure, f"Measured speedup {timed(figure, run.clock)} over plain decoding {interval}{elapsed}"


def speedup_caption(run: Run) -> str:
    speed = run.speed
    return timed("speedup over plain decoding" if speed is None or speed.speedup >= 1 else
                 "plain decoding's speed: slower here", run.clock)


def theory_lines(run: Run) -> list[tuple[str, str, str]]:
    """(name, value, note) rows for the theory: at this machine's measured pass cost, and the ideal."""
    s, speed = run.stats, run.speed
    rows = []
    here = run.theory_at_pass_cost
    if speed is not None and here is not None:
        rows.append(("Verification pass cost", f"{speed.pass_cost:.2f} plain steps",
                     "median time of a pass over the drafted tokens \u00f7 median plain step, measured"))
        rows.append(("Theory at this pass cost", f"{here:.2f}{X}",
                     "(1 \u2212 \u03b1^(n+1)) / ((1 \u2212 \u03b1)(n c + 1)) passes, each costing the measured "
                     "pass cost: what this machine should give"))
    rows.append(("Ideal theory (pass cost 1)", f"{ideal_speedup(s, speed):.2f}{X}",
                 f"the same with a pass over k + 1 tokens costing one plain step, as a GPU approaches "
                 f"(drafting at its measured cost); best k for this \u03b1 and c: {s.best_k}"))
    return rows


def cross_tokenizer_lines(run: Run) -> list[tuple[str, str, str]]:
    """(name, value, note) rows for a run drafted across tokenizers (none for any other run): how many
    of its own tokens the draft ran per target token it proposed and, under token-level intersection
    sampling, how much of its probability lay in the vocabulary both models share."""
    s = run.stats
    if s.draft_tokens_per_target_token is None:
        return []
    rows = [("Draft tokens per target token", f"{s.draft_tokens_per_target_token:.2f}",
             f"across tokenizers: the draft model ran {s.draft_model_tokens} of its own tokens for the {s.drafted} "
             "target tokens it proposed (the ones the alignment cut count too)")]
    if s.shared_mass is not None:
        rows.append(("Draft mass in the shared vocabulary", f"{s.shared_mass:.1%}",
                     "the mean share of the draft's probability on tokens both vocabularies have (token-level "
                     "intersection: the rest is dropped and the draft renormalised)"))
    return rows


def busy_host_text(run: Run) -> str | None:
    """A warning when the host was busy while the run was timed (`models.host.HostLoad.busy`), else None."""
    load = run.host_load
    if load is None or not load.busy:
        return None
    measured = [f"load {load.load_average:.1f} on {load.cpus} cores"] if load.load_average is not None else []
    if load.steal_share is not None:
        measured.append(f"{load.steal_share:.0%} steal")
    fair = "; the interleaved speedup stays fair (both methods paid alike)" if run.steps else ""
    return f"the host was busy ({', '.join(measured)}): absolute times and tokens/s are inflated{fair}"


def policy_text(run: Run) -> str | None:
    """How the draft length was chosen, and what the cost-aware policy did ('' before any cycle)."""
    s, settings = run.stats, run.settings
    if settings.dynamic_k:
        return f"dynamic k ({settings.k} to {settings.max_k or 2 * settings.k}, transformers' heuristic)"
    if settings.fixed_k or s.cycles_paused is None:
        return f"fixed, k = {settings.k} every cycle"
    return (f"cost-aware, up to k = {settings.k}: drafted in {s.cycles_drafted} of {s.cycles} cycles, paused "
            f"speculation in {s.cycles_paused} (no draft length expected to beat a plain step)")


def drafters_text(run: Run) -> str | None:
    """A hybrid run's drafts by drafter (None for a run of one drafter): each one's drafts and tokens
    accepted, and the cycles none drafted."""
    s = run.stats
    if not s.drafters:
        return None
    parts = [f"{drafter_word(name)} ({name}) {c['num_drafts']} drafts, {c['num_accepted_tokens']} of "
             f"{c['num_draft_tokens']} tokens accepted ({c['draft_acceptance_rate']:.0%})"
             for name, c in sorted(s.drafters.items(), key=lambda item: -item[1]["num_drafts"])]
    return "; ".join(parts) + f"; none in {s.cycles - s.num_drafts} of {s.cycles} cycles"


def calibration_text(run: Run) -> str | None:
    """What the cost-aware policy's calibration took before this run (None without the policy)."""
    if not run.settings.cost_aware:
        return None
    first = (f"; time to the first token {run.first_token_wall_seconds:.2f} s (wall clock, warm-up and calibration "
             "included)") if run.first_token_wall_seconds is not None else ""
    costs = decided_on_text(run)
    if run.calibration_seconds > 0:
        return (f"{run.calibration_seconds:.2f} s (wall clock) before the race, timing {' and '.join(run.calibrated)}: "
                f"excluded from both methods' figures{first}{costs}")
    return (f"none in this run (this process had measured this target's passes and this drafter's drafting "
            f"already){first}{costs}")


def decided_on_text(run: Run) -> str:
    """The measured costs the policy decided from, in plain steps ("" when the run has none)."""
    table = run.decided_on
    if not table:
        return ""
    passes, widest = table["pass_steps"], len(table["pass_steps"]) - 1
    shown = [w for w in (1, 4, widest) if 0 < w <= widest]
    text = (f"; it decided from a plain step of {table['step_seconds'] * 1000:.1f} ms ({run.clock}), a pass verifying "
            + ", ".join(f"{w} drafted token{'s' if w > 1 else ''} {passes[w]:.2f} steps" for w in dict.fromkeys(shown)))
    by_context = {int(c): steps for c, steps in (table.get("pass_steps_by_context") or {}).items()}
    if len(by_context) > 1:
        w = min(4, widest)
        text += (f"; a pass verifying {w} drafted token{'s' if w > 1 else ''} "
                 + ", ".join(f"{steps[w]:.2f} steps after {c} tokens" for c, steps in sorted(by_context.items()))
                 + " of context (priced between the two nearest each pass's)")
    if drafting := table.get("drafting_steps_per_token") or {}:
        later = table.get("drafting_steps_by_context") or {}

        def after(name: str) -> str:
            steps = sorted((int(c), v) for c, v in (later.get(name) or {}).items())[1:]
            return f" ({', '.join(f'{v:.2f} after {c} tokens' for c, v in steps)})" if steps else ""
        text += "; drafting per token " + ", ".join(f"{name} {v:.2f} steps{after(name)}"
                                                    for name, v in drafting.items())
    if rows := sorted({r for counts in (table.get("transposed_rows") or {}).values() for r in counts}):
        text += f"; products of {rows[0]}-{rows[-1]} rows oriented as measured fastest here, for both methods"
    return text + " (fixed for this process once measured)"


def summary_lines(run: Run) -> list[str]:
    """The command line's summary of one run."""
    s = run.stats
    lines = [f"{run.target_name} drafted by {run.draft_name}: {s.tokens} tokens in {s.cycles} target passes "
             f"({run.dtype} on {run.device})",
             f"acceptance: draft acceptance rate {s.draft_acceptance_rate:.1%} ({s.accepted} of {s.drafted} drafted "
             f"tokens), mean acceptance length {s.mean_acceptance_length:.2f} ({s.num_drafts} passes with drafts)",
             f"own loop: {s.tokens_per_cycle:.2f} tokens per target pass (all {s.cycles}), alpha {s.alpha:.2f}, "
             f"mean k {s.mean_k:.1f}",
             f"cost ratio c = {cost_ratio_text(run)}"]
    policy = policy_text(run)
    if policy:
        lines.append(f"draft length: {policy}")
    drafters = drafters_text(run)
    if drafters:
        lines.append(f"drafters: {drafters}")
    calibration = calibration_text(run)
    if calibration:
        lines.append(f"calibration: {calibration}")
    lines += [f"{name.lower()}: {value}; {note}" for name, value, note in cross_tokenizer_lines(run)]
    lines.append(f"speculative: {s.tokens_per_second:.1f} tokens/s (with prefill, {run.clock})")
    if run.steps:
        lines.append(f"plain:       {run.plain.tokens_per_second:.1f} tokens/s (with prefill, {run.clock})")
        parted = parted_text(run)
        if parted:
            lines.append(f"warning: {parted}")
        lines.append(f"measured speedup: {speed_text(run)}")
        lines.append(f"  compared: {compared_text(run)}")
    for name, value, _note in theory_lines(run):   # the notes are the run view's; the summary is name: value
        lines.append(f"{name.lower()}: {value}")
    if run.steps and run.settings.same_output and run.done:
        kind = "greedy" if run.settings.temperature == 0 else "sampled (invariant)"
        if run.identical:
            lines.append(f"{kind} outputs identical: yes")
        else:
            lines.append(f"{kind} outputs identical: no, they diverge at token {run.divergence} (reduced precision "
                         f"such as bf16 can flip near-tied logits; {float32_advice(run.device).lower()})")
    if run.elapsed_wall_seconds is not None:
        lines.append(f"race: {elapsed_text(run.elapsed_wall_seconds)}")
    busy = busy_host_text(run)
    if busy:
        lines.append(f"warning: {busy}")
    return lines


# ----------------------------------------------------------------------------- comparisons

def baseline_labels(comparison: Comparison) -> list[tuple[str, Run]]:
    """Each plain baseline with a name that tells it apart from the others (by target, then by
    sampling settings), and the first run that ran it."""
    firsts = comparison.baselines()
    many_targets = len({r.target_name for r in firsts}) > 1
    named = []
    for run in firsts:
        details = [run.target_name] if many_targets else []
        if len(firsts) > len({r.target_name for r in firsts}):   # same target, other sampling settings
            t = run.settings.temperature
            details.append("greedy" if t == 0 else f"T={t:g}")
        named.append(("plain decoding" + (f" ({', '.join(details)})" if details else ""), run))
    return named


def winner_line(comparison: Comparison) -> str:
    """One sentence: which configuration was fastest, and why: more tokens per target pass
    (acceptance), cheaper drafting (k c), or cheaper target passes (verifying fewer tokens)."""
    head, why = winner_parts(comparison)
    return f"{head}, {why}." if why else head


def winner_parts(comparison: Comparison) -> tuple[str, str]:
    """`winner_line` in two: the short answer (who won, by how much), and why ('' when alone)."""
    order = ranked(comparison)
    if not order:
        return "No configuration has finished yet.", ""
    (label, best) = order[0]
    if len(order) == 1:
        return f"{label}: {best.speedup or 0:.2f}{X} over plain decoding.", ""
    runner_label, runner = order[1]
    head = (f"{label} won: {best.speedup or 0:.2f}{X} over plain decoding against {runner.speedup or 0:.2f}{X} "
            f"for {runner_label}")
    if (best.speedup or 0) < 1.0:
        head = (f"No configuration beat plain decoding; {label} came closest: {best.speedup or 0:.2f}{X} against "
                f"{runner.speedup or 0:.2f}{X} for {runner_label}")
    a, b = best.stats.tokens_per_cycle, runner.stats.tokens_per_cycle
    d, e = draft_cost(best.stats), draft_cost(runner.stats)
    v, w = pass_seconds(best.cycles), pass_seconds(runner.cycles)
    factors = [
        ("acceptance", a > 1.05 * b, b > 1.05 * a, f"{a:.2f} tokens per target pass against {b:.2f}"),
        ("draft cost", d < e - 0.05, d > e + 0.05,
         f"drafting costs {d:.2f} of a target pass per cycle against {e:.2f}"),
        ("verification cost", v < 0.9 * w, w < 0.9 * v,
         f"a target pass took {1000 * v:.0f} ms against {1000 * w:.0f} ms"),
    ]
    # A pass verifies the drafted tokens: fewer of them is the one reason for cheaper passes.
    n, m = drafted_per_cycle(best.stats), drafted_per_cycle(runner.stats)
    if v < 0.9 * w:
        extra = (f", verifying {n:.1f} drafted tokens against {m:.1f}" if n < m
                 else ", although it verified as many drafted tokens or more (timing noise?)")
        factors[2] = factors[2][:3] + (factors[2][3] + extra,)
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
        why = "with similar acceptance, draft cost and verification cost: a margin this small can be timing noise"
    return head, why


# "acceptance rate" and "acceptance length" are vLLM's figures (docs/figures.md); "per pass" is the own
# loop's tokens per target pass, every pass counted; tokens/s is with prefill, the speedup decode only.
TABLE_HEADERS = ["configuration", "acceptance rate", "acceptance length", "per pass", "c", "speedup", "95% range",
                 "theory here", "ideal theory", "tokens/s"]
# A column only where a configuration drafts across tokenizers: its draft model's own tokens per
# target token it proposed (what re-tokenization costs the draft).
CROSS_TOKENIZER_HEADER = "draft tokens per target token"


def _across_tokenizers(comparison: Comparison) -> bool:
    return any(run.stats.draft_tokens_per_target_token is not None for run in comparison.results)


def table_headers(comparison: Comparison) -> list[str]:
    """The headers of `table_rows(comparison)`."""
    return TABLE_HEADERS + ([CROSS_TOKENIZER_HEADER] if _across_tokenizers(comparison) else [])


def _range(run: Run) -> str:
    speed = run.speed
    return "" if speed is None else f"{speed.low:.2f}\u2013{speed.high:.2f}{X}" + ("" if speed.reliable else " (short)")


def table_rows(comparison: Comparison) -> list[list[str]]:
    """The summary table as text cells (headers: `table_headers`): one row per configuration, then
    one per plain baseline. speedup: decode-only, against the configuration's baseline; theory here:
    at the measured pass cost; ideal theory: at pass cost 1."""
    across = _across_tokenizers(comparison)
    rows = []
    for label, run in comparison.pairs():
        s = run.stats
        here = run.theory_at_pass_cost
        rows.append([label, f"{s.draft_acceptance_rate:.1%}", f"{s.mean_acceptance_length:.2f}",
                     f"{s.tokens_per_cycle:.2f}", f"{s.cost_ratio:.3f}", f"{run.speedup or 0:.2f}{X}", _range(run),
                     "" if here is None else f"{here:.2f}{X}", f"{ideal_speedup(s, run.speed):.2f}{X}",
                     f"{s.tokens_per_second:.1f}"])
        if across:
            per_token = s.draft_tokens_per_target_token
            rows[-1].append("" if per_token is None else f"{per_token:.2f}")
    for name, run in baseline_labels(comparison):
        rows.append([name, "", "", "1.00", "", f"1.00{X}", "", "", "", f"{run.plain.tokens_per_second:.1f}"]
                    + [""] * across)
    return rows


def identity_line(comparison: Comparison) -> str:
    """Whether the configurations that must write plain decoding's output (greedy, or sampled with
    drafter-invariant sampling) wrote exactly it ("" if none must)."""
    greedy = [(label, r) for label, r in comparison.pairs() if r.settings.same_output and r.steps]
    if not greedy:
        return ""
    kind = "Greedy outputs" if all(r.settings.temperature == 0 for _, r in greedy) else "Outputs"
    differ = [f"{label} from token {r.divergence}" for label, r in greedy if not r.identical]
    if not differ:
        return f"{kind}: identical to plain decoding's ({len(greedy)} of {len(greedy)})."
    return (f"{kind}: " + "; ".join(differ) + " differs from plain decoding's (reduced precision such as "
            "bfloat16 can flip near-tied logits; float32 gives exact equality).")


SWEEP_HEADERS = ["k", "acceptance rate", "acceptance length", "per pass", "c", "speedup", "theory", "tokens/s"]


def sweep_rows(sweep: Sweep) -> list[list[str]]:
    """One row per k (headers: SWEEP_HEADERS); theory is at the pooled alpha and median c."""
    return [[str(k), f"{r.stats.draft_acceptance_rate:.1%}", f"{r.stats.mean_acceptance_length:.2f}",
             f"{r.stats.tokens_per_cycle:.2f}", f"{r.stats.cost_ratio:.3f}", f"{r.speedup or 0:.2f}{X}",
             f"{sweep.theory(k):.2f}{X}", f"{r.stats.tokens_per_second:.1f}"] for k, r in sweep.points]


def sweep_line(sweep: Sweep) -> str:
    if not sweep.points:
        return "No k has finished yet."
    k = sweep.best_measured_k
    measured = dict(sweep.points)[k].speedup or 0.0
    return (f"Best measured k = {k} ({measured:.2f}{X}); the theory, at the measured \u03b1 = {sweep.alpha:.2f} "
            f"and c = {sweep.cost_ratio:.3f}, puts the best k at {sweep.best_theory_k} "
            f"({sweep.theory(sweep.best_theory_k):.2f}{X}).")


def timing_note(runs: Sequence[Run]) -> str:
    """What the speedups of a comparison compare, and the clock that timed them."""
    clocks = sorted({run.clock for run in runs})
    if not clocks:
        return ""
    return (f"Speedups compare decode-only time per token against plain decoding of the same prompt, timed by "
            f"{' / '.join(clock_text(c) for c in clocks)}; the ranges are 95% intervals of the timing noise.")


def plain_rate_line(runs: Sequence[Run]) -> str:
    first = next((r for r in runs if r.plain), None)
    return "" if first is None else f"plain decoding: {first.plain.tokens_per_second:.1f} tokens/s"
