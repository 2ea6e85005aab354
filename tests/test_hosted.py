"""Hosted mode against a hostile public (issue 21): prompts and work capped in tokens and checked
before any decoding, suffix-decoding memory bounded and freed with its session, temporary files that
go, and API values of the wrong type explained. The tiny in-process pair throughout."""

import dataclasses
import html
import os
import re
import time
from types import SimpleNamespace

import pytest
import torch
from conftest import counting_forwards
from tiny_pair import PROMPT

from specviz.catalog import BenchPrompt
from specviz.core.lookup_trees import SuffixDrafter
from specviz.runs import prompt_sets as prompt_sets_module
from specviz.runs import iter_prompt_set
from specviz.settings import HOSTED_MAX_PROMPT_TOKENS, LOCAL, RunSettings, hosted, validate
from specviz.ui import budget, build_demo, common, compare_tab, fields, run_tab, teach_tab
from specviz.ui.common import CHAT, PROMPT_LOOKUP, RAW, TICK
from specviz.views.run_view import RunView

STATS = RunView._fields.index("stats")     # the Run endpoint's outputs, in RunView's order

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")  # gr.Warning outside a request

HOSTED = hosted([])                     # the built-in target only (the tiny loader stands in for it)
LONG = "a " * 1100                      # 2,200 characters (under the 4,000 cap), 1,100+ tokens (over 1,024)


def views(work, *args):
    return [view for view in work(*args) if view is not TICK]


def text(markup) -> str:
    return html.unescape(re.sub(r"<[^>]+>", " ", markup))


def run_inputs(prompt, **changes):
    values = dict(prompt=prompt, target="", drafter=PROMPT_LOOKUP, draft_model="", exit_layer=1, k=4, dynamic_k=False,
                  temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=16, seed=0, prompt_format=CHAT, branch=1)
    values.update(changes)
    return list(values.values())


# ----------------------------------------------------------------------------- #3: caps in tokens, before work

def test_every_tab_refuses_a_prompt_over_the_token_cap_before_decoding(tiny):
    assert len(LONG) <= HOSTED.max_prompt_chars and HOSTED.max_prompt_tokens == HOSTED_MAX_PROMPT_TOKENS == 1024
    expected = re.compile(r"The prompt is 1,10\d tokens as the model reads it \(chat template included\); this "
                          r"hosted demo allows 1,024\. Shorten it")
    rows = [[True, "", "ngram", 4, False, 0.0]]
    with counting_forwards(tiny.target) as forwards:
        run = views(run_tab.run_work(HOSTED, tiny.loader), *run_inputs(LONG))[-1].stats
        teach = views(teach_tab.teach_work(HOSTED, tiny.loader), LONG, PROMPT_LOOKUP, "", 1, 4, 0.0, 0, 16, CHAT)
        compare = views(compare_tab.compare_work(HOSTED, tiny.loader), LONG, rows, 16, 0, CHAT)[-1].status
        sweep = views(compare_tab.compare_work(HOSTED, tiny.loader, sweep=True), LONG, rows, 16, 0, CHAT)[-1].status
    for shown in (run, teach[-1].narrative, compare, sweep):
        assert expected.search(text(shown)), text(shown)
    assert forwards == []                   # no prefill, no warm-up: nothing decoded


def test_the_cap_counts_the_chat_template_and_binds_where_the_model_could_run(tiny):
    # 60 words fit the tiny model's 512-token context; under a 61-token cap the chat template's
    # two turn markers tip them over, as raw text they fit.
    limits = dataclasses.replace(HOSTED, max_prompt_tokens=61)
    prompt = " ".join(["cat"] * 60)
    with counting_forwards(tiny.target) as forwards:
        chat = views(run_tab.run_work(limits, tiny.loader), *run_inputs(prompt))[-1].stats
    assert "The prompt is 62 tokens" in text(chat) and forwards == []
    raw = views(run_tab.run_work(limits, tiny.loader), *run_inputs(prompt, prompt_format=RAW))[-1].stats
    assert "Finished" in text(raw)


def test_a_prompt_set_counts_every_decode_its_baselines_included(tiny):
    # Issue 21: 1 configuration x 15 prompts x 5 rounds x 256 new tokens was accepted as 19,200 tokens
    # although it decodes twice that (each prompt's plain baseline too), prompts not counted at all.
    rows = [[True, "", "ngram", 4, False, 0.0]]
    examples = next(s for s in compare_tab.sources(HOSTED) if "examples" in s)
    with counting_forwards(tiny.target) as forwards:
        refused = text(views(compare_tab.compare_work(HOSTED, tiny.loader), "", rows, 256, 0, CHAT, examples, None,
                             5)[-1].status)
    assert forwards == []
    found = re.search(r"This comparison counts ([\d,]+) tokens of work: 1 configuration x 15 prompts x 5 rounds make "
                      r"75 speculative decodes \(earlier turns included\) and 75 plain baselines, each its prompt's "
                      r"tokens \(([\d,]+) in all\) plus up to 256 new tokens; this hosted demo allows 24,000\. "
                      r"To fit, use (\d) rounds? or at most (\d+) new tokens or fewer configurations", refused)
    assert found, refused
    total, prompts, rounds, new_tokens = (int(g.replace(",", "")) for g in found.groups())
    assert total == prompts + 150 * 256
    per_round = total // 5
    assert rounds * per_round <= 24_000 < (rounds + 1) * per_round
    assert prompts + 150 * new_tokens <= 24_000 < prompts + 150 * (new_tokens + 8)


def test_the_count_is_what_the_comparison_runs(tiny, monkeypatch):
    # Two configurations with different sampling need two baselines per prompt; earlier turns are
    # decoded too. Count the decodes `runs.iter_prompt_set` really starts, and the prompt tokens.
    configs = [validate(RunSettings(fixed_k=True, draft="ngram", k=3, max_new_tokens=8)),
               validate(RunSettings(fixed_k=True, draft="ngram", k=2, max_new_tokens=8, temperature=0.7, seed=1)),
               validate(RunSettings(fixed_k=True, draft="ngram", k=4, max_new_tokens=8))]  # shares the 1st baseline
    prompts = [BenchPrompt("a", "x", PROMPT), BenchPrompt("b", "x", "the dog ran", False, ("the sun", "a bird sang"))]
    started = []
    real_race = prompt_sets_module.race

    def counting_race(settings, prompt, pair, *, baseline=False, warm_up=True, seed=None):
        started.append((baseline, budget.prompt_tokens(pair.tokenizer, prompt, settings.chat)))
        return real_race(settings, prompt, pair, baseline=baseline, warm_up=warm_up, seed=seed)

    monkeypatch.setattr(prompt_sets_module, "race", counting_race)
    for _ in iter_prompt_set(configs, prompts, repeats=2, loader=tiny.loader):
        pass
    work = budget.set_work(configs, prompts, 2, {None: tiny.tokenizer}, LOCAL)
    assert work.speculative == len(started) == 2 * 3 * (1 + 3)
    assert work.plain == sum(baseline for baseline, _ in started) == 2 * 2 * 2
    assert work.prompt_tokens == sum(n * (2 if baseline else 1) for baseline, n in started)
    assert work.total == work.prompt_tokens + (work.speculative + work.plain) * 8


def test_a_prompt_set_within_the_budget_runs(tiny):
    rows = [[True, "", "ngram", 4, False, 0.0]]
    chat_set = next(s for s in compare_tab.sources(HOSTED) if s.startswith("Set: chat"))
    final = views(compare_tab.compare_work(HOSTED, tiny.loader), "", rows, 8, 0, CHAT, chat_set, None, 1)[-1]
    assert "sv-error" not in final.status and "5 prompts" in text(final.status)


# ----------------------------------------------------------------------------- #4: suffix memory

def reference_proposal(earlier: list[list[int]], ids: list[int], k: int, max_match: int, max_occurrences: int):
    """The drafter's rule by brute force: the longest suffix (<= max_match) found before (earlier
    requests oldest first, then this one, never the suffix itself); what followed its first
    `max_occurrences` occurrences, each marked whether it came from an earlier request."""
    sources = [(seq, True) for seq in earlier] + [(ids, False)]
    for size in range(min(max_match, len(ids)), 0, -1):
        suffix = ids[-size:]
        found = [(seq[end:end + k], old) for seq, old in sources for end in range(size, len(seq))
                 if seq[end - size:end] == suffix]
        if found:
            return size, found[:max_occurrences]
    return 0, []


def test_suffix_drafts_follow_the_rule_over_several_requests():
    import random

    from specviz.core.lookup_trees import trie_draft

    rng = random.Random(0)
    for trial in range(40):
        vocab = rng.choice([3, 6, 40])
        drafter = SuffixDrafter(max_occurrences=rng.choice([3, 64]))
        earlier = []
        for _ in range(rng.randint(1, 4)):
            ids = [rng.randrange(vocab) for _ in range(rng.randint(1, 30))]
            drafter.begin(torch.tensor([ids]))
            seen = ids                      # a request is remembered as the drafter last saw it
            for _ in range(rng.randint(1, 12)):
                k = rng.randint(1, 8)
                match, found = reference_proposal(earlier, ids, k, drafter.max_match, drafter.max_occurrences)
                budget_here = min(drafter.budget, max(1, int(drafter.spec_factor * match)))
                expected = trie_draft([c for c, _ in found], budget_here, drafter.min_token_prob * len(found), "cpu",
                                      earlier=[old for _, old in found])
                draft, seen = drafter.propose(torch.tensor([ids]), k, None), ids
                assert (draft.tokens.tolist(), draft.parents, draft.from_earlier) == \
                    (expected.tokens.tolist(), expected.parents, expected.from_earlier), trial
                ids = ids + [rng.randrange(vocab) for _ in range(rng.randint(1, 3))]
            earlier.append(seen)


def test_suffix_memory_is_bounded_in_tokens_least_recently_used_dropped_first():
    drafter = SuffixDrafter(max_tokens=100)
    first, second, third = ([base + i for i in range(40)] for base in (1000, 2000, 3000))
    for ids in (first, second):
        drafter.begin(torch.tensor([ids]))
        drafter.propose(torch.tensor([ids]), 4, None)
    drafter.begin(torch.tensor([[1000, 1001, 1002]]))       # drafts from the first request: it was used last
    assert drafter.propose(torch.tensor([[1000, 1001, 1002]]), 4, None).tokens.tolist()[:1] == [1003]
    drafter.begin(torch.tensor([third]))
    drafter.propose(torch.tensor([third]), 4, None)
    drafter.begin(torch.tensor([[7]]))
    kept = [ids.tolist() for ids in drafter.earlier]
    assert drafter.tokens_kept <= 100 and kept == [first, [1000, 1001, 1002], third]   # the second went
    assert all(ids.dtype == torch.int32 for ids in drafter.earlier)                    # 4 bytes a token
    drafter.begin(torch.tensor([list(range(150))]))
    drafter.propose(torch.tensor([list(range(150))]), 4, None)
    drafter.begin(torch.tensor([[7]]))
    assert [ids.tolist() for ids in drafter.earlier] == [list(range(50, 150))]         # a long one keeps its end
    assert drafter.without_memory().max_tokens == 100 and drafter.without_memory().requests == 0


def test_session_memories_are_bounded_and_freed_when_the_session_ends(tiny):
    from specviz.ui.common import SessionMemories

    memories = SessionMemories(max_sessions=2)
    pair = tiny.pair(None, "suffix")
    drafters = {name: memories.pair_for(pair, name).draft for name in ("a", "b")}
    assert memories.pair_for(pair, "a").draft is drafters["a"]            # a session keeps its own
    memories.pair_for(pair, "c")                                           # "b" was used least recently
    assert memories.pair_for(pair, "b").draft is not drafters["b"]
    assert len(memories) == 2                                              # "a" went for "b": at most two
    memories.end(SimpleNamespace(session_hash="b"))                        # as the page's unload calls it
    assert len(memories) == 1
    assert memories.pair_for(tiny.pair(None, "ngram"), "d").draft.name == "ngram" and len(memories) == 1


def test_the_page_frees_a_sessions_memory_when_it_unloads(tiny):
    from gradio.helpers import special_args

    demo = build_demo(loader=tiny.loader, hosted=True)
    unloads = [fn for fn in demo.fns.values() if any(target[1] == "unload" for target in fn.targets)]
    # One handler: Gradio runs each as an event of the closing session, giving it page state again.
    assert [fn.fn.__name__ for fn in unloads] == ["end_session"]
    # Gradio hands the Run work its request (by the annotation), just before the stop signal.
    run = next(fn for fn in demo.fns.values() if fn.api_name == "run")
    args, *_ = special_args(run.fn, list(range(len(run.inputs))), request="the request")
    assert args[-2:] == ["the request", len(run.inputs) - 1]


def test_sessions_ending_together_are_collected_once():
    # A class closing its tabs ends thirty sessions within a second: one collection for the burst,
    # and a session ending after it has run is collected again.
    from specviz.ui.app import MemoryRelease

    ran = []
    release = MemoryRelease(delay=0.2, release=lambda: ran.append(time.monotonic()))
    for _ in range(30):
        release.soon()
    time.sleep(0.6)
    assert len(ran) == 1
    release.soon()
    time.sleep(0.6)
    assert len(ran) == 2


@pytest.mark.slow
def test_a_closed_session_leaves_no_state_on_the_server(tiny, monkeypatch):
    # Issue 25: Gradio kept each closed session's page state (every output's last value: token views,
    # figures) and its gr.State values, ~4 MB a session, until 10,000 later sessions pushed it out.
    # A real server and API client: while a session is open it has state; once closed, none is left.
    from gradio_client import Client

    from specviz.ui.app import SESSION_CAPACITY, launch_options
    from specviz.ui.common import SUFFIX

    # The server notices a closed client at its next heartbeat (every 15 s by default).
    monkeypatch.setenv("GRADIO_HEARTBEAT_INTERVAL", "1")
    demo = build_demo(loader=lambda settings, progress=None: tiny.pair(None, settings.draft, progress), hosted=True)
    demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True, **launch_options(hosted=True))
    try:
        holder = demo.state_holder
        assert holder.capacity == SESSION_CAPACITY
        for session in range(3):
            client = Client(demo.local_url, verbose=False)
            for run in range(2):
                inputs = [f"{PROMPT} {session} {run}", "", SUFFIX, "", 1, 8, False, 0.0, 1.0, 0, 16, 0, RAW, 1]
                assert "Finished" in client.predict(*inputs, api_name="/run")[STATS]
            state = holder.session_data[client.session_hash]
            assert state.state_data and state.blocks_config.blocks    # its signals, its updated outputs
            client.close()                                            # the heartbeat ends: Gradio's unload
            deadline = time.monotonic() + 20
            while client.session_hash in holder.session_data and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.5)                      # nothing brings it back afterwards
            assert client.session_hash not in holder.session_data and not holder.time_last_used
        assert len(holder.session_data) == 0
    finally:
        demo.close()


# ----------------------------------------------------------------------------- #8: temporary files

def test_temporary_files_go_within_minutes(tiny, tmp_path, monkeypatch):
    import tempfile

    demo = build_demo(loader=tiny.loader, hosted=True)
    every, age = demo.delete_cache
    assert (every, age) == (common.TEMP_SWEEP_SECONDS, common.TEMP_FILE_SECONDS) and every + age <= 11 * 60
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    old, young = tmp_path / (common.EXPORT_PREFIX + "old"), tmp_path / (common.EXPORT_PREFIX + "young")
    for folder in (old, young):
        folder.mkdir()
        (folder / "summary.json").write_text("{}")
    os.utime(old, (time.time() - common.TEMP_FILE_SECONDS - 1,) * 2)
    common.SessionMemories().end(SimpleNamespace(session_hash="x"))     # a session's end sweeps them
    assert not old.exists() and young.exists()


def test_an_upload_is_removed_by_the_apps_cache_rule(tiny, monkeypatch):
    # The same rule, run by Gradio on a live server: every upload lands in the app's temporary set.
    import httpx

    demo = build_demo(loader=tiny.loader, hosted=True)
    demo.delete_cache = (1, 1)              # the rule's shape, at a test's pace
    demo.launch(server_name="127.0.0.1", prevent_thread_lock=True, quiet=True)
    try:
        response = httpx.post(demo.local_url + "gradio_api/upload", files={"files": ("r.json", b"{}" * 1000)})
        (path,) = response.json()
        assert os.path.exists(path)
        deadline = time.monotonic() + 15
        while os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not os.path.exists(path)
    finally:
        demo.close()


# ----------------------------------------------------------------------------- drafts across tokenizers

def test_a_cross_tokenizer_draft_off_the_allow_list_is_refused_before_any_load(tiny):
    from specviz.catalog import list_presets
    from specviz.ui.common import DRAFT_MODEL

    limits = hosted(list_presets())              # the presets that ship: cross-tokenizer pairs among them
    assert {"Qwen/Qwen2.5-0.5B-Instruct", "SmolLM2-135M-Instruct"} <= limits.draft_models
    assert validate(RunSettings(target="microsoft/Phi-3.5-mini-instruct", draft="SmolLM2-135M-Instruct"), limits)
    # Another family's model with another tokenizer, not a preset's: one message, nothing loaded.
    message = ("This hosted demo only runs the preset draft models; 'Qwen/Qwen2.5-1.5B-Instruct' is not one of "
               "them.")
    before = len(tiny.calls)
    final = views(run_tab.run_work(limits, tiny.loader), *run_inputs(PROMPT, drafter=DRAFT_MODEL,
                                                                      draft_model="Qwen/Qwen2.5-1.5B-Instruct"))
    assert len(final) == 1 and message in text(final[-1].stats)
    rows = [[True, "", "ngram", 4, False, 0.0, 1], [True, "", "Qwen/Qwen2.5-1.5B-Instruct", 4, False, 0.0, 1]]
    refused = views(compare_tab.compare_work(limits, tiny.loader), PROMPT, rows, 16, 0, CHAT)
    assert len(refused) == 1 and f"Row 2: {message}" in text(refused[-1].status)
    assert len(tiny.calls) == before


# ----------------------------------------------------------------------------- #9: values of the wrong type

def test_values_that_are_not_numbers_reach_validation():
    slider = fields.NumberSlider(1, 16, value=4, step=1)
    box = fields.NumberBox(0, precision=0)
    assert slider.preprocess("abc") == "abc" and box.preprocess([1]) == [1] and slider.preprocess(True) is True
    assert slider.preprocess(4.0) == 4 and box.preprocess(2.4) == 2
    assert slider.get_block_name() == "slider" and box.get_block_name() == "number"   # drawn as Gradio's own


@pytest.mark.parametrize("changes, message", [
    (dict(k="abc"), "k (tokens drafted per cycle) must be a whole number from 1 to 16, got 'abc'"),
    (dict(temperature="warm"), "temperature must be a number from 0 to 2, got 'warm'"),
    (dict(max_new_tokens=None), "max new tokens must be a whole number from 1 to 256, got None"),
    (dict(seed=[1]), "seed must be a whole number"),
    (dict(k=True), "k (tokens drafted per cycle) must be a whole number"),
])
def test_the_run_work_explains_values_of_the_wrong_type(tiny, changes, message):
    final = views(run_tab.run_work(HOSTED, tiny.loader), *run_inputs(PROMPT, **changes))[-1]
    assert message in html.unescape(final.stats)
