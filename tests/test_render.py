"""The token view, the summary and the charts: pure functions of events."""

import dataclasses
import html
import re

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from conftest import make_cycle
from tiny_pair import PROMPT
from specviz.core.events import ACCEPTED, NOT_REACHED, REJECTED, Step
from specviz.models import Detokenizer
from specviz.runs.result import CycleText, Run
from specviz.runs.run import cycle_text
from specviz.settings import RunSettings
from specviz.views import charts, render
from specviz.views.prose import speedup_headline

TEXT = ["the cat sat on the mat", "héllo wörld, naïve café", "日本語のテキスト", "a <b> & \"c\"\nnew line"]


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer small enough that accented and CJK characters span several tokens."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(TEXT * 5, trainers.BpeTrainer(
        vocab_size=280, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def make_run(cycles, steps=(), **settings) -> Run:
    """A finished run built by hand (hand-picked timings), for the views."""
    return Run(settings=RunSettings(**settings), prompt="p", target_name="t", draft_name="ngram", target_parameters=1,
               draft_parameters=0, dtype="float32", device="cpu", clock="thread CPU time", prompt_tokens=3,
               eos_token_ids=[], baseline=bool(steps), cycles=list(cycles),
               texts=[cycle_text(c, _Letters()) for c in cycles], steps=list(steps),
               step_texts=["x"] * len(steps), spec_done=True, plain_done=True)


class _Letters:
    """A stand-in detokenizer: token i reads as one letter."""
    def push(self, token):
        return chr(97 + token % 26)

    def fork(self):
        return self


def pieces_of(cycle, detok):
    return render.cycle_pieces(cycle, cycle_text(cycle, detok))


def verdicts(markup):
    return re.findall(r'data-verdict="(\w+)"', markup)


# ----------------------------------------------------------------------------- decoding

def test_detokenizer_keeps_multibyte_characters_whole(tokenizer):
    ids = tokenizer.encode("naïve café 日本語 ok")
    assert len(ids) > len("naïve café 日本語 ok".split())  # some characters span several tokens
    detok = Detokenizer(tokenizer)
    pieces = [detok.push(t) for t in ids]
    assert "".join(pieces) == tokenizer.decode(ids)
    assert not any("\ufffd" in p for p in pieces)
    assert "" in pieces  # a token that only starts a character shows nothing; the next carries it


def test_detokenizer_fork_leaves_the_original_alone(tokenizer):
    context = tokenizer.encode("the cat ")
    detok = Detokenizer(tokenizer, context)
    side = detok.fork()
    side.push(tokenizer.encode("mat")[0])
    assert "".join(detok.push(t) for t in tokenizer.encode("sat")) == "sat"


def test_cycle_pieces_order_and_verdicts(tokenizer):
    a, b, c, fix = (tokenizer.encode(w)[0] for w in ("the", " cat", " sat", " mat"))
    pieces = pieces_of(make_cycle(drafted=(a, b, c), num_accepted=1, correction=fix), Detokenizer(tokenizer))
    assert [p.verdict for p in pieces] == ["accepted", "rejected", "rejected", "resampled"]
    assert [p.text for p in pieces] == [tokenizer.decode([a]), tokenizer.decode([b]), tokenizer.decode([c]),
                                        tokenizer.decode([fix])]
    assert "draft p = 0.900, target p = 0.400" in pieces[0].title


def test_cycle_pieces_bonus_and_eos_end(tokenizer):
    detok = Detokenizer(tokenizer)
    bonus = pieces_of(make_cycle(drafted=(5, 6), num_accepted=2, correction=7), detok)
    assert [p.verdict for p in bonus] == ["accepted", "accepted", "bonus"]
    nothing_drafted = pieces_of(make_cycle(drafted=(), num_accepted=0, correction=8), detok)
    assert [p.verdict for p in nothing_drafted] == ["bonus"] and "nothing was drafted" in nothing_drafted[0].title
    eos_end = pieces_of(make_cycle(drafted=(5, 0), num_accepted=2, correction=None), detok)
    assert [p.verdict for p in eos_end] == ["accepted", "accepted"]


# ----------------------------------------------------------------------------- HTML

def test_render_token_escapes_text_and_title():
    markup = render.render_token(render.Piece('<script>"x"</script>', "accepted", 'p = "1" <b>'))
    assert "<script>" not in markup and "&lt;script&gt;" in markup
    assert 'title="p = &quot;1&quot; &lt;b&gt;"' in markup
    assert verdicts(markup) == ["accepted"]


def test_render_token_shows_newlines_and_rejects_unknown_verdicts():
    markup = render.render_token(render.Piece("a\nb", "bonus", ""))
    assert "\u21b5" in markup and "\n" in markup
    with pytest.raises(ValueError):
        render.render_token(render.Piece("x", "maybe", ""))


def test_every_verdict_has_a_mark_besides_colour():
    css = render.CSS
    for verdict in render.VERDICTS:
        assert re.search(rf"\.sv-{verdict} \{{[^}}]*background: rgba", css)
    assert re.search(r"\.sv-rejected \{[^}]*line-through", css)
    assert re.search(r"\.sv-resampled \{[^}]*underline wavy", css)
    assert re.search(r"\.sv-bonus \{[^}]*underline double", css)


def test_legend_names_every_verdict_and_the_cycle_boundary():
    legend = render.legend_html()
    for verdict in render.VERDICTS:
        assert f'data-legend="{verdict}"' in legend and f"sv-{verdict}" in legend
    assert "sv-cycle-sample" in legend and "one cycle" in legend
    assert "data-verdict" not in legend  # the legend's samples are not counted as tokens


def test_cycles_are_wrapped_with_boundaries(tokenizer):
    detok = Detokenizer(tokenizer)
    cycles = [make_cycle(index=i, drafted=(5, 6), num_accepted=1, correction=7) for i in range(3)]
    html_cycles = [render.render_cycle(c.index, pieces_of(c, detok)) for c in cycles]
    view = render.token_view_html(html_cycles, "9 tokens")
    assert view.count('class="sv-cycle"') == 3
    assert re.findall(r'data-cycle="(\d+)"', view) == ["0", "1", "2"]
    assert verdicts(view) == ["accepted", "rejected", "resampled"] * 3
    assert "sv-legend" in view and "9 tokens" in view


def test_summary_names_the_speedup_its_range_clock_and_both_theories():
    # 12 passes of 0.05 s emitting 2 tokens each against 25 plain steps of 0.04 s: 1.6x decode-only.
    cycles = [make_cycle(index=i, drafted=(1, 2), num_accepted=1, correction=9, draft_seconds=0.0, verify_seconds=0.05)
              for i in range(13)]
    steps = [Step(index=i, token=(1, 9)[i % 2], prob=0.5, seconds=0.04) for i in range(26)]   # the same text
    markup = render.summary_html(make_run(cycles, steps), state="Finished.", notes=["a <note>"])
    text = html.unescape(re.sub(r"<[^>]+>", " ", markup))
    assert "Measured speedup 1.60\u00d7 (thread CPU time) over plain decoding (95% range 1.60\u20131.60\u00d7)" in text
    assert "26 tokens in 1.04 s (thread CPU time)" in text
    assert "timed by thread CPU time" in text and "over the same 26 tokens, written by both" in text
    assert "Verification pass cost" in text and "1.25 plain steps" in text
    assert "< 0.001 (prompt lookup runs no model)" in text
    assert "a &lt;note&gt;" in markup
    waiting = render.summary_html(make_run(cycles[:1], steps[:1]), state="")
    assert "waiting for both methods to pass their prefill" in waiting


def test_the_headline_and_the_panels_name_their_clock_and_the_run_its_wall_time():
    cycles = [make_cycle(index=i, drafted=(1, 2), num_accepted=1, correction=9, draft_seconds=0.0, verify_seconds=0.05)
              for i in range(13)]
    steps = [Step(index=i, token=(1, 9)[i % 2], prob=0.5, seconds=0.04) for i in range(26)]
    run = make_run(cycles, steps)
    run.elapsed_wall_seconds = 6.31
    big, headline = speedup_headline(run)
    assert big == "1.60\u00d7"
    assert headline.startswith("Measured speedup 1.60\u00d7 (thread CPU time) over plain decoding")
    assert headline.endswith("; 6.3 s elapsed (wall clock)")
    run.clock = "wall clock, device-synchronised"
    assert "Measured speedup 1.60\u00d7 (wall clock, device-synchronised) over" in speedup_headline(run)[1]
    # a GPU's wall clock counts the host's launches and waits for a card others may share
    assert "(other programs on this machine can move it)" in render.summary_html(run, state="")
    assert render.race_status(26, 1.04, True, "thread CPU time") == (
        "26 tokens \u00b7 1.04 s \u00b7 25.0 tokens/s (thread CPU time) \u00b7 done")


def test_parted_outputs_advise_float32_by_the_devices_dtype_policy():
    """On a CPU 'auto' is float32; on a GPU it is the serving dtype, and float32 is not exact there either."""
    from specviz.views.compared_prose import parted_text

    cycles = [make_cycle(index=i, drafted=(1, 2), num_accepted=1, correction=9) for i in range(13)]
    steps = [Step(index=i, token=(1, 9)[i % 2] if i < 10 else 5, prob=0.5, seconds=0.04) for i in range(26)]
    run = dataclasses.replace(make_run(cycles, steps), dtype="bfloat16")
    assert "Choose dtype float32 (what 'auto' picks on a CPU) for identical outputs" in parted_text(run)
    on_gpu = parted_text(dataclasses.replace(run, device="cuda:0"))
    assert "'auto' on a GPU is the serving dtype" in on_gpu and "what 'auto' picks" not in on_gpu


def test_comparison_note():
    from specviz.views.run_view import comparison_note

    texts = lambda ids: [chr(97 + i) for i in ids]  # noqa: E731
    assert "identical" in comparison_note([1, 2, 3], [1, 2, 3], texts([1, 2, 3]), texts([1, 2, 3]),
                                                 "float32", True, True)
    note = comparison_note([1, 2, 3], [1, 4, 3], texts([1, 2, 3]), texts([1, 4, 3]), "torch.bfloat16",
                                  True, True)
    assert "diverge at token 1" in note and "bfloat16" in note and "near" in note
    assert "after \u201cb\u201d" in note and "wrote 'c'" in note and "wrote 'e'" in note
    assert comparison_note([1], [2], ["b"], ["c"], "float32", True, False) is None
    assert "Sampled" in comparison_note([1], [2], ["b"], ["c"], "float32", False, True)


def test_error_box_is_escaped():
    markup = render.error_html("no model <x>")
    assert "no model &lt;x&gt;" in markup and 'role="alert"' in markup


# ----------------------------------------------------------------------------- charts

def test_charts_have_the_expected_traces():
    cycles = [make_cycle(index=0, drafted=(1, 2, 3), num_accepted=3, correction=4),
              make_cycle(index=1, drafted=(1, 2, 3), num_accepted=0, correction=4),
              make_cycle(index=2, drafted=(), num_accepted=0, correction=4)]
    steps = [Step(index=i, token=t, prob=0.5, seconds=0.04) for i, t in enumerate([1, 2, 3, 4, 4])]
    acceptance, per_pass, race, positions, timeline = charts.run_figures(make_run(cycles, steps))
    assert [t.name for t in acceptance.data] == ["this cycle", "cumulative"]
    assert list(acceptance.data[0].y) == [1.0, 0.0, None]
    assert list(acceptance.data[1].y) == [1.0, 0.5, 0.5]
    assert [t.name for t in per_pass.data][:2] == ["this pass", "running mean"]
    assert per_pass.data[2].name.startswith("theory")
    assert list(per_pass.data[0].y) == [4, 1, 1]
    assert [t.name for t in race.data] == ["speculative", "plain", "running speedup (right)"]
    assert list(race.data[0].y) == [0, 4, 5, 6] and list(race.data[1].y) == list(range(6))
    assert "speedup" in race.layout.title.text
    assert list(positions.data[0].y) == [0.5, 0.5, 0.5]
    # The timeline: each cycle's drafting then its pass on the speculative lane, the steps on the plain lane.
    assert [t.name for t in timeline.data] == ["drafting", "verification pass", "plain step (one token)"]
    drafting, passes, plain = timeline.data
    assert list(drafting.x) == [0.01] * 3 and list(passes.x) == [0.04] * 3
    assert list(passes.base) == pytest.approx([0.01, 0.06, 0.11])
    assert list(drafting.base) == pytest.approx([0, 0.05, 0.1])
    assert list(plain.base) == pytest.approx([0.0, 0.04, 0.08, 0.12, 0.16]) and set(plain.y) == {"plain"}
    assert list(plain.marker.opacity) == [1.0] * 5        # the same text so far: every step is compared


def test_the_tokens_per_pass_chart_draws_the_policys_draft_lengths_and_pauses():
    from conftest import make_cycle

    from specviz.metrics import summarize
    from specviz.views.charts import tokens_per_pass_figure

    cycles = [make_cycle(0, drafted=(1, 2, 3, 4), num_accepted=0, k=8, planned=4, expected_gain=1.2),
              make_cycle(1, drafted=(), num_accepted=0, k=8, planned=0, expected_gain=0.91),
              make_cycle(2, drafted=(5, 6), num_accepted=2, k=8, planned=2, expected_gain=0.95, probe=True)]
    figure = tokens_per_pass_figure(cycles, summarize(cycles))
    traces = {t.name: t for t in figure.data}
    assert list(traces["drafted"].y) == [4, 0, 2]
    assert list(traces["paused (plain step)"].x) == [2]
    notes = [row[0] for row in traces["drafted"].customdata]
    assert notes == [": expected 1.20x", ": expected 0.91x", ": expected 0.95x (a probe)"]
    # Without the policy (a fixed k), neither trace.
    fixed = [make_cycle(0, k=4), make_cycle(1, k=4)]
    names = {t.name for t in tokens_per_pass_figure(fixed, summarize(fixed)).data}
    assert "drafted" not in names and "paused (plain step)" not in names


def test_before_a_run_the_charts_have_the_run_charts_axes_and_no_data():
    cycles = [make_cycle(index=i) for i in range(3)]
    steps = [Step(index=i, token=1, prob=0.5, seconds=0.04) for i in range(5)]
    empty, full = charts.run_figures(), charts.run_figures(make_run(cycles, steps))
    for before, after in zip(empty, full, strict=True):    # the same charts: nothing moves when a run starts
        assert after.layout.title.text.startswith(before.layout.title.text)
        assert (before.layout.xaxis.title.text, before.layout.yaxis.title.text) == (
            after.layout.xaxis.title.text, after.layout.yaxis.title.text)
        assert [t.name for t in before.data] == [t.name for t in after.data][:len(before.data)]
    acceptance, per_pass, race, positions, timeline = empty
    assert all(len(trace.y) == 0 for figure in (acceptance, per_pass, positions, timeline) for trace in figure.data)
    assert [list(trace.y) for trace in race.data] == [[0], [0], []]    # both methods start at the origin


def test_empty_charts_name_the_button_that_fills_them():
    for action in ("Run", "Play"):
        texts = [figure.layout.annotations[0].text for figure in charts.run_figures(action=action)]
        assert all(text.startswith(f"{action} to see ") for text in texts) and len(set(texts)) == 5


def test_a_tree_run_shows_the_nodes_each_pass_verified():
    tree = make_cycle(index=0, drafted=(1, 2, 3), num_accepted=1, correction=9, parents=[-1, -1, 0], path=[0],
                      node_verdicts=[ACCEPTED, REJECTED, NOT_REACHED])
    per_pass = charts.run_figures(make_run([tree, tree]))[1]
    assert [t.name for t in per_pass.data][-1] == "nodes verified" and list(per_pass.data[-1].y) == [3, 3]
    chain = charts.run_figures(make_run([make_cycle(index=0), make_cycle(index=1)]))[1]
    assert "nodes verified" not in [t.name for t in chain.data]


def parted_run(dtype="bfloat16"):
    """A greedy race whose outputs part at token 6: plain stops at 8 tokens, speculative writes 16."""
    spec = [1, 2, 3, 4, 5, 6, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
    cycles = [make_cycle(index=i, drafted=spec[j:j + 1], num_accepted=1, correction=spec[j + 1], draft_seconds=0.0,
                         verify_seconds=0.05) for i, j in enumerate(range(0, 16, 2))]
    steps = [Step(index=i, token=t, prob=0.5, seconds=0.04) for i, t in enumerate([1, 2, 3, 4, 5, 6, 7, 8])]
    run = make_run(cycles, steps)
    run.dtype = dtype
    return run


def test_outputs_that_part_are_said_before_the_headline_and_the_speedup_covers_what_both_wrote():
    run = parted_run()
    assert run.divergence == 6 and run.compared.tokens == 6 and len(run.compared.cycles) == 3
    html = render.summary_html(run, state="")
    banner = html.index('class="sv-parted"')
    assert banner < html.index('class="sv-tiles"') < html.index('class="sv-headline"')
    assert "part at token 6" in html and "the 6 tokens both wrote" in html and "float32" in html
    assert "over the 6 tokens both wrote" in html                # the headline says what it compares
    # Three passes of 0.05 s wrote 6 tokens; decode only: 2 passes, 4 tokens against 5 steps of 0.04 s.
    assert run.speed.speedup == pytest.approx((5 * 0.04 / 5) / (2 * 0.05 / 4))
    from specviz.views.compared_prose import compared_text
    from specviz.views.prose import summary_lines
    assert "the first 6 tokens, which both wrote" in compared_text(run)
    lines = summary_lines(run)
    warning = next(i for i, line in enumerate(lines) if line.startswith("warning: Greedy outputs part"))
    assert warning < next(i for i, line in enumerate(lines) if line.startswith("measured speedup"))
    # The charts leave the unequal part out of the speedup and fade it in the timeline.
    race, timeline = charts.run_figures(run)[2], charts.run_figures(run)[4]
    assert "first 6 tokens" in race.layout.title.text
    assert list(timeline.data[1].marker.opacity) == [1.0] * 3 + [charts.NOT_COMPARED_OPACITY] * 5
    assert list(timeline.data[2].marker.opacity) == [1.0] * 6 + [charts.NOT_COMPARED_OPACITY] * 2


def test_outputs_that_part_at_a_near_tie_compare_the_same_text_once_plain_decoding_followed_it():
    """After the race, plain decoding stepped along the speculative text from the parting (`Run.followed`):
    the speedup, the headline, the details and the charts compare the same 16 tokens and say so."""
    from specviz.core.events import Followed
    from specviz.views import charts
    from specviz.views.compared_prose import compared_text

    run = parted_run()
    spec = run.tokens
    run.followed = Followed(start=6, steps=tuple(Step(index=i, token=spec[i], prob=0.5, seconds=0.04)
                                                 for i in range(6, 16)), near_ties=((6, 0.125),))
    assert (run.compared.tokens, len(run.compared.cycles), len(run.compared.steps)) == (16, 8, 16)
    # Decode only: 7 passes of 0.05 s wrote 14 tokens, against 15 steps of 0.04 s.
    assert run.speed.speedup == pytest.approx(0.04 / (7 * 0.05 / 14))
    html = render.summary_html(run, state="")
    assert "part at token 6" in html and "the same 16 tokens" in html and "near-ties apart" in html
    assert "token 6 by 0.125" in compared_text(run) and "timed after the race" in compared_text(run)
    timeline = charts.run_figures(run)[4]
    plain = next(t for t in timeline.data if t.name == "plain step (one token)")
    assert len(plain.x) == 16          # plain decoding's steps as the speedup timed them


def test_identical_outputs_show_no_warning():
    cycles = [make_cycle(index=i, drafted=(1,), num_accepted=1, correction=1) for i in range(4)]
    steps = [Step(index=i, token=1, prob=0.5, seconds=0.04) for i in range(8)]
    html = render.summary_html(make_run(cycles, steps), state="")
    assert "sv-parted" not in html and "identical outputs" in html


# ----------------------------------------------------------------------------- across tokenizers

def cross_tokenizer_run(tiny, **options):
    """A greedy run of the tiny target drafted by itself under another tokenizer (reversed ids)."""
    from specviz.runs import execute

    settings = RunSettings(draft="other-tokenizer", k=4, max_new_tokens=24, chat=False, fixed_k=True, **options)
    return execute(settings, PROMPT, tiny.loader(settings), baseline=True, warm_up=False)


def boxed(markup, kind):
    return [html.unescape(t) for t in re.findall(rf'<span class="sv-piece sv-piece-{kind}">([^<]*)</span>', markup)]


def without_retokenization(markup):
    """A cycle's HTML with what drafting across tokenizers adds taken out: its line and the tooltips' line."""
    markup = re.sub(r'<details class="sv-retok".*?</details>', "", markup, flags=re.S)
    return re.sub(r"\nacross tokenizers: [^\"]*", "", markup)


def test_a_cross_tokenizer_cycle_shows_the_drafts_own_tokens_and_the_target_tokens_they_became(tiny):
    from specviz.views.teach_rows import visible

    run = cross_tokenizer_run(tiny)
    told = [(c, t) for c, t in zip(run.cycles, run.texts) if c.is_cross_tokenizer]
    assert len(told) >= 3 and all(c.cut_text for c, _ in told)
    for cycle, text in told:
        markup = render.cycle_html(cycle, text)
        # One closed line per cycle, behind a mark: each token boxed, the cut one too.
        assert markup.count('<details class="sv-retok"') == 1 and "<details open" not in markup
        assert boxed(markup, "draft") == [visible(p) for p in cycle.draft_pieces]
        assert boxed(markup, "target") == [visible(t) for t in text.drafted]
        assert boxed(markup, "cut") == [visible(cycle.cut_text)] and "(left for the next cycle)" in markup
        # The same line in every drafted token's tooltip, boundaries as |, spaces as ␣.
        line = (f"draft: `{'|'.join(visible(p) for p in cycle.draft_pieces)}` \u2192 target: "
                f"`{'|'.join(visible(t) for t in text.drafted)}`; cut: `{visible(cycle.cut_text)}` "
                "(left for the next cycle)")
        assert line.startswith("draft: `\u2423")           # the tiny tokenizers' words start with a space
        titles = [html.unescape(t) for t in re.findall(r'title="([^"]*)"', markup)]
        assert sum(f"across tokenizers: {line}" in t for t in titles) == len(cycle.drafted)
        assert line in titles                             # the mark's own tooltip
        # Nothing else changes: without the added line it is the cycle as drafted in the target's tokens.
        plain = dataclasses.replace(cycle, draft_pieces=None, cut_text=None)
        assert without_retokenization(markup) == render.cycle_html(plain, text)
    # A cycle that drafted nothing across tokenizers (the last, with no room left to draft) has no line.
    assert all(("sv-retok" in render.cycle_html(c, t)) == c.is_cross_tokenizer for c, t in zip(run.cycles, run.texts))


def test_same_tokenizer_cycles_show_no_retokenization(tiny):
    from specviz.runs import execute

    settings = RunSettings(fixed_k=True, draft="small", k=4, max_new_tokens=16, chat=False)
    run = execute(settings, PROMPT, tiny.loader(settings), warm_up=False)
    markup = "".join(render.run_cycles_html(run))
    assert "sv-retok" not in markup and "across tokenizers" not in markup
    assert run.note == "" and "note" not in run.summary()
    summary = render.summary_html(run, state="Finished.")
    assert "Draft tokens per target token" not in summary and "sv-pair-note" not in summary


def test_the_retokenization_line_escapes_and_shows_whitespace():
    cycle = make_cycle(drafted=(1, 2), num_accepted=2, draft_pieces=[" jump", "ed", " <b>", "\n"], cut_text="\n")
    text = CycleText([" jumped", " <b>"], "x")
    assert render.retokenization(cycle, text) == ("draft: `\u2423jump|ed|\u2423<b>|\u21b5` \u2192 target: "
                                                  "`\u2423jumped|\u2423<b>`; cut: `\u21b5` (left for the next "
                                                  "cycle)")
    markup = render.cycle_html(cycle, text)
    assert "<b>" not in markup and boxed(markup, "draft") == ["\u2423jump", "ed", "\u2423<b>", "\u21b5"]
    # Nothing cut (the draft ended its text), and a draft that wrote no token.
    assert "cut" not in render.retokenization(dataclasses.replace(cycle, cut_text=""), text)
    empty = make_cycle(drafted=(), num_accepted=0, draft_pieces=[], cut_text="")
    assert render.retokenization(empty, CycleText([], "x")) == "draft: `(no tokens)` \u2192 target: `(no tokens)`"


def test_the_summary_of_a_cross_tokenizer_run_counts_draft_tokens_per_target_token_and_shows_the_note(tiny):
    from specviz.models.pairs import CROSS_TOKENIZER_NOTE

    run = cross_tokenizer_run(tiny)
    stats = run.stats
    assert run.note == CROSS_TOKENIZER_NOTE and run.summary()["note"] == CROSS_TOKENIZER_NOTE
    summary = render.summary_html(run, state="Finished.")
    assert f'<div class="sv-pair-note">{html.escape(CROSS_TOKENIZER_NOTE)}</div>' in summary
    row = re.search(r"Draft tokens per target token</th><td[^>]*>([^<]*)</td><td>([^<]*)</td>", summary)
    assert row and row[1] == f"{stats.draft_tokens_per_target_token:.2f}"
    assert f"ran {stats.draft_model_tokens} of its own tokens for the {stats.drafted} target tokens" in row[2]
    assert stats.draft_model_tokens > stats.drafted      # the cut token of each cycle counts
    assert "Cost ratio c" in summary and "Draft acceptance rate" in summary
    assert "shared vocabulary" not in summary            # greedy, one-hot: no token-level intersection
    # With token-level intersection the mean share of the draft's probability there is shown too.
    shared = dataclasses.replace(run, cycles=[dataclasses.replace(c, shared_mass=[0.5, 0.7] if c.is_cross_tokenizer
                                                                  else None) for c in run.cycles], _stats=(-1, None))
    assert re.search(r"Draft mass in the shared vocabulary</th><td[^>]*>60\.0%<", render.summary_html(shared, state=""))


def test_the_timeline_is_drawn_when_the_run_ends():
    from specviz.views.run_view import RunRenderer

    run = parted_run()
    assert RunRenderer().view(run, "Running").timeline is None                 # live updates leave it as it is
    assert [t.name for t in RunRenderer().view(run, "Finished.", final=True).timeline.data][0] == "drafting"
