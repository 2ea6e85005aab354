"""A run's page, the one rendering path for a run: the Run tab draws a live run with it, the Replay
tab a recorded one, and the HTML report the same views again, so a replay and its report show what
the live run showed."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from ..clocks import clock_text
from ..runs import Run
from . import charts, render
from .prose import busy_host_text


class RunView(NamedTuple):
    """A run's views, in the order of the Run tab's outputs (figures None: not redrawn this time)."""
    tokens: str
    baseline: str
    acceptance: object
    per_pass: object
    race: object
    positions: object
    timeline: object
    stats: str


def empty_view(stats: str = "") -> RunView:
    return RunView(render.token_view_html([]), render.baseline_html(""), *charts.run_figures(), stats)


def stopped_view() -> RunView:
    """A run stopped before it decoded anything."""
    return empty_view(render.stopped_html(render.idle_html()))


def describe(run: Run) -> str:
    s = run.settings
    sampling = ("greedy" if s.temperature == 0 else f"temperature {s.temperature:g}, top-p {s.top_p:g}, "
                f"top-k {s.top_k}, seed {s.seed}, {s.sampling} sampling")
    k = f"k = {s.k}" + (" (dynamic)" if s.dynamic_k else "")
    return (f"{run.target_name} with {run.draft_name} \u00b7 {k} \u00b7 {sampling} \u00b7 {s.max_new_tokens} new "
            f"tokens \u00b7 {run.dtype} on {run.device} \u00b7 timed by {clock_text(run.clock)}")


class RunRenderer:
    """A run's views; each cycle's HTML is rendered once, when it arrives (the run may only grow)."""

    def __init__(self):
        self.cycle_html: list[str] = []

    def view(self, run: Run, state: str, *, final: bool = False, with_charts: bool = True) -> RunView:
        for cycle, text in zip(run.cycles[len(self.cycle_html):], run.texts[len(self.cycle_html):]):
            self.cycle_html.append(render.cycle_html(cycle, text))
        plain_seconds = run.plain.seconds if run.plain else 0.0
        tokens = render.token_view_html(self.cycle_html, render.race_status(run.stats.tokens, run.stats.seconds,
                                                                            run.spec_done, run.clock),
                                        drafters=list(run.stats.drafters or ()))
        baseline = render.baseline_html("".join(run.step_texts),
                                        render.race_status(len(run.steps), plain_seconds, run.plain_done, run.clock))
        figures = charts.run_figures(run) if with_charts else (None,) * len(charts.EMPTY_TEXT)
        if not final:
            # The timeline (a segment per event) is drawn once the run ends: redrawn with every live
            # update it delayed the first verdict on a busy 2-core host (3-6 s to 9-40 s, headless Chromium).
            figures = figures[:-1] + (None,)
        if not run.cycles:
            stats = render.idle_html()
        else:
            notes = [describe(run)]
            busy = busy_host_text(run)
            if busy:
                notes.append(f"Timing: {busy}.")
            if final:
                note = comparison_note(run.tokens, run.baseline_tokens, run.emitted_texts(), run.step_texts,
                                              run.dtype, run.settings.temperature == 0, run.done,
                                              invariant=run.settings.same_output)
                if note:
                    notes.append(note)
            stats = render.summary_html(run, state=state, notes=notes)
        return RunView(tokens, baseline, *figures, stats)

    def stopped(self, run: Run) -> RunView:
        """The run as it stood when a Stop ended it, under the banner that says so."""
        view = self.view(run, "", final=True)
        return view._replace(stats=render.stopped_html(view.stats))


def comparison_note(spec_tokens: Sequence[int], plain_tokens: Sequence[int], spec_texts: Sequence[str],
                    plain_texts: Sequence[str], dtype: str, greedy: bool, complete: bool, *,
                    invariant: bool = False) -> str | None:
    """For greedy runs, and sampled ones with drafter-invariant sampling (`invariant`): whether both
    methods wrote the same tokens, and if not, where they part (`*_texts`: each token's text as
    decoded in context, aligned with the tokens)."""
    from ..equal_work import first_divergence

    if not greedy and not invariant:
        return ("Sampled run, classic sampling: the two outputs are draws from the same distribution, "
                "so they are not expected to match (drafter-invariant sampling makes them match).")
    if not complete:
        return None
    kind = "Greedy" if greedy else "Sampled with drafter-invariant sampling (one seed for both)"
    at = first_divergence(spec_tokens, plain_tokens)
    if at is None:
        return f"{kind}: the speculative and plain outputs are identical ({len(spec_tokens)} tokens)."
    shared = "".join(spec_texts[:at])[-60:]
    spec_next = spec_texts[at] if at < len(spec_texts) else "(end)"
    plain_next = plain_texts[at] if at < len(plain_texts) else "(end)"
    reduced = dtype in ("bfloat16", "float16", "torch.bfloat16", "torch.float16")
    why = (f"In {dtype.replace('torch.', '')}, a forward over several tokens and a one-token step can "
           "round differently, and where the top two logits nearly tie the argmax flips: both outputs "
           "are valid greedy decodings of the model. Use float32 for exact equality.") if reduced else (
           "Greedy decoding should agree exactly; numerical differences between one-token and "
           "multi-token forwards at a near-tie of the top two logits are the usual cause.")
    return (f"{kind}: the outputs diverge at token {at} (after \u201c{shared}\u201d: speculative wrote "
            f"{spec_next!r}, plain wrote {plain_next!r}). {why}")
