"""Greedy outputs that part at a near-tie (reduced precision rounds a one-token step and a multi-token
pass differently): after the race, plain decoding steps along the speculative text (`core.plain.follow`),
and the speedup compares the same text (`equal_work.ALONG_NEAR_TIES`). The tiny target is made to part so:
two tokens get the same output row (their logits tie exactly, whatever the kernel), and a forward over
more than one position breaks the tie the other way (the later token wins, where plain decoding's argmax
takes the first), as rounding flips a near-tie between a pass and a step; one-token steps are untouched."""

import collections
import copy
import dataclasses

import pytest
from tiny_pair import PROMPT

from specviz.equal_work import ALONG_NEAR_TIES, SHARED_PREFIX
from specviz.runs import execute
from specviz.runs import recording as rec
from specviz.settings import RunSettings


def changing_logits(model, change):
    """`model` (a copy) whose logits go through `change(logits, passes)` after every forward, `passes`
    true for a forward over more than one position; it returns the logits to keep."""
    model = copy.deepcopy(model)

    def hook(_module, args, kwargs, output):
        ids = kwargs.get("input_ids", args[0] if args else None)
        output.logits = change(output.logits.clone(), ids is not None and ids.shape[1] > 1)
        return output

    model.register_forward_hook(hook, with_kwargs=True)
    return model


def breaking_ties_in_passes(model, first: int, second: int):
    """`model` (a copy) whose `second` logit is always `first`'s, exactly (a tie that argmax breaks toward
    `first`), and a multi-position forward puts `second` ahead by 0.001."""
    def change(logits, passes):
        logits[..., second] = logits[..., first] + (1e-3 if passes else 0.0)
        return logits

    return changing_logits(model, change)


def swapping_close_logits_in_passes(model, width: float):
    """`model` (a copy) whose multi-position forwards swap the top two logits where they are within `width`:
    more than a near-tie apart in float32."""
    def change(logits, passes):
        if passes:
            top = logits.topk(2, dim=-1)
            first, second = top.values[..., 0], top.values[..., 1]
            rows = ((first - second) < width).nonzero(as_tuple=True)
            logits[rows + (top.indices[..., 0][rows],)] = second[rows]
            logits[rows + (top.indices[..., 1][rows],)] = first[rows]
        return logits

    return changing_logits(model, change)


SETTINGS = RunSettings(target="tiny", draft="same", k=4, max_new_tokens=40, chat=False, fixed_k=True)


def made_pair(tiny, settings, target):
    """The tiny pair for `settings` with `target`, which the "same" drafter drafts with too."""
    pair = tiny.loader(settings)
    drafter = copy.copy(pair.draft)
    drafter.model = target if settings.draft == "same" else drafter.model
    return dataclasses.replace(pair, target=target, draft=drafter)


def parted_race(tiny, made):
    return execute(SETTINGS, PROMPT, made_pair(tiny, SETTINGS, made(tiny.target)), baseline=True)


def tied(tiny):
    """The token plain decoding writes most for PROMPT, tied with the last token of the vocabulary."""
    settings = RunSettings(target="tiny", draft="ngram", k=4, max_new_tokens=40, chat=False, fixed_k=True)
    plain = execute(settings, PROMPT, tiny.loader(settings), baseline=True).baseline_tokens
    first = collections.Counter(plain).most_common(1)[0][0]
    return lambda model: breaking_ties_in_passes(model, first, model.config.vocab_size - 1)


def test_a_near_tie_parting_is_compared_along_the_speculative_text(tiny, tmp_path):
    run = parted_race(tiny, tied(tiny))
    assert run.divergence is not None and run.followed is not None and run.followed.start == run.divergence
    work = run.compared
    assert work.basis == ALONG_NEAR_TIES and work.tokens == run.stats.tokens
    assert [s.token for s in work.steps] == run.tokens                 # the same text on both sides
    assert work.steps[:run.divergence] == run.steps[:run.divergence]   # plain decoding's own steps before it
    # Every position where the speculative text took the later token: a tie, margin 0, the first the parting.
    second = run.tokens[run.divergence]
    ties = [at for at, token in enumerate(run.tokens) if token == second]
    assert len(ties) > 1 and work.near_ties == tuple((at, 0.0) for at in ties) and ties[0] == run.divergence
    assert run.summary()["compared_basis"] == ALONG_NEAR_TIES and run.summary()["compared_near_ties"]
    # A recording keeps it, and its replay says the same once it has all played.
    loaded = rec.load(rec.save(tmp_path / "run.json", [run])).runs[0]
    assert loaded.followed == run.followed and loaded.summary() == run.summary()
    *_, (_, played) = rec.replay(loaded)
    assert played.compared.basis == ALONG_NEAR_TIES and played.speed.speedup == pytest.approx(run.speed.speedup)


def test_a_parting_wider_than_a_near_tie_compares_the_shared_prefix_only(tiny):
    run = parted_race(tiny, lambda model: swapping_close_logits_in_passes(model, 0.5))
    assert run.divergence is not None and run.followed.stopped_at == run.divergence
    assert run.followed.steps == () and run.compared.basis == SHARED_PREFIX
    assert run.compared.tokens <= run.divergence


@pytest.mark.slow
def test_the_built_in_models_bf16_partings_are_near_ties_and_compared_along_the_text():
    """The built-in SmolLM2-135M-Instruct in bfloat16, prompt lookup, four bundled prompts whose greedy
    outputs part from plain decoding's on this project's CPUs: after each race plain decoding follows the
    speculative text, and it writes it too but for near-ties, so the speedup compares past the parting."""
    from specviz.catalog import load_bench_prompts
    from specviz.runs import load_models

    wanted = {"chat-sky", "chat-paris", "code-palindrome", "maths-speed"}
    prompts = [p for p in load_bench_prompts() if p.id in wanted]
    settings = RunSettings(draft="ngram", k=8, max_new_tokens=96, dtype="bfloat16")
    pair = load_models(settings)
    parted = []
    for prompt in prompts:
        run = execute(dataclasses.replace(settings, chat=prompt.chat), prompt.prompt, pair, baseline=True)
        if run.divergence is None:
            assert run.followed is None and run.compared.tokens == run.stats.tokens
            continue
        parted.append(run)
        work = run.compared
        assert run.followed.start == run.divergence
        assert [s.token for s in work.steps] == run.tokens[:work.tokens]
        assert all(margin <= 0.5 for _, margin in work.near_ties)       # a few bf16 steps at logits of ~20
    if not parted:
        pytest.skip("no bf16 output parted from plain decoding's on this CPU: nothing to follow")
    assert any(run.compared.basis == ALONG_NEAR_TIES and run.compared.tokens > run.divergence for run in parted)


def test_configurations_sharing_one_baseline_are_each_followed(tiny):
    """Compare's configurations share the first one's plain decoding (`Run.attach_baseline`): each whose
    output parts from it is followed along its own text, as a race with its own baseline is."""
    from specviz.runs.compare import compare

    target = tied(tiny)(tiny.target)
    configs = [dataclasses.replace(SETTINGS, draft=draft) for draft in ("same", "small")]
    def loader(settings, progress=None):
        return made_pair(tiny, settings, target)

    first, second = compare(configs, PROMPT, loader=loader).results
    assert second.steps is first.steps                                  # one baseline
    for run in (first, second):
        assert run.divergence is not None and run.followed.start == run.divergence
        assert run.compared.basis == ALONG_NEAR_TIES and run.compared.tokens == run.stats.tokens


def test_a_race_stopped_while_plain_decoding_follows_stops_at_once(tiny):
    """Following yields every few steps (untimed ones too), so that a Stop during it stops it there; what
    was followed so far is what the speedup compares (nothing past the parting yet: the shared prefix)."""
    from specviz.runs import race

    races = race(SETTINGS, PROMPT, made_pair(tiny, SETTINGS, tied(tiny)(tiny.target)), baseline=True)
    for run in races:
        if run.followed is not None:
            break
    races.close()
    assert run.done and run.followed.steps == () and run.followed.stopped_at is None
    assert run.compared.basis == SHARED_PREFIX and run.compared.tokens <= run.divergence
