"""Few-row products in the faster orientation (models.cpu_linear): the same products, the same
decoding, measured once per model, float32 CPU layers only."""

import pytest
import torch

from conftest import make_llama, truncated_copy
from specviz import PromptLookupDrafter, speculative_decode
from specviz.core.drafters import DraftModelDrafter
from specviz.core.lookup_trees import SuffixDrafter
from specviz.core.plain import autoregressive_decode
from specviz.models import cpu_linear
from specviz.models.cpu_linear import MAX_ROWS, OrientedLinear, orient_linears, unorient_linears

EVERY_ROW_COUNT = frozenset(range(1, 65))


def transposed_everywhere(model):
    """Every linear layer of `model` computing every input of up to 64 rows as `W @ x.T`."""
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = OrientedLinear
            module.transposed_rows = EVERY_ROW_COUNT
    return model


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(3,), (1, 1), (1, 5), (2, 4), (1, 9)])
def test_an_oriented_layer_computes_the_stock_layers_product(bias, shape):
    torch.manual_seed(0)
    stock = torch.nn.Linear(48, 80, bias=bias)
    oriented = torch.nn.Linear(48, 80, bias=bias)
    oriented.load_state_dict(stock.state_dict())
    transposed_everywhere(oriented)
    x = torch.randn(*shape, 48)
    with torch.inference_mode():
        want, got = stock(x), oriented(x)
    assert got.shape == want.shape == (*shape, 80)
    # Contiguous, as the stock layer's: a column-major result slowed the next layer's product 4x.
    assert got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_one_row_is_computed_as_two_and_keeps_its_own_values():
    # A 1-row input goes through the 2-row kernel (the row twice); the row's values are its own product.
    torch.manual_seed(1)
    weight, row = torch.randn(80, 48), torch.randn(1, 48)
    got = cpu_linear.transposed_product(weight, row)
    assert got.shape == (1, 80) and got.is_contiguous()
    torch.testing.assert_close(got, row @ weight.t(), rtol=1e-5, atol=1e-5)
    two = torch.randn(2, 48)
    torch.testing.assert_close(cpu_linear.transposed_product(weight, two), two @ weight.t(), rtol=1e-5, atol=1e-5)


def test_orienting_times_each_float32_layer_shape_once_and_leaves_other_layers(monkeypatch):
    model = make_llama(0)
    half = make_llama(0).to(torch.bfloat16)
    chosen = orient_linears(model)
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is OrientedLinear for m in linears)
    assert set(chosen) == {tuple(m.weight.shape) for m in linears}
    for shape, rows in chosen.items():
        assert set(rows) <= set(range(1, MAX_ROWS + 1))
        assert all(m.transposed_rows == frozenset(rows) for m in linears if tuple(m.weight.shape) == shape)

    def timed_again(*args, **kwargs):
        raise AssertionError("a model is measured once")

    monkeypatch.setattr(cpu_linear, "interleaved_seconds", timed_again)
    assert orient_linears(model) is chosen
    monkeypatch.undo()
    assert orient_linears(half) == {}          # not measured where it was not: bfloat16 stays stock
    assert all(type(m) is torch.nn.Linear for m in half.modules() if isinstance(m, torch.nn.Linear))
    unorient_linears(model)
    assert all(type(m) is torch.nn.Linear for m in model.modules() if isinstance(m, torch.nn.Linear))


@pytest.fixture(scope="module")
def oriented():
    target = transposed_everywhere(make_llama(0, layers=4))
    prompt = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 10, 5, 6, 7]])
    return target, transposed_everywhere(truncated_copy(target, 1)), prompt


def drafters(smaller):
    return {"ngram": PromptLookupDrafter, "draft model": lambda: DraftModelDrafter(smaller), "suffix": SuffixDrafter}


@pytest.mark.parametrize("name", ["ngram", "draft model", "suffix"])
def test_greedy_speculation_on_oriented_layers_writes_plain_decodings_tokens(oriented, name):
    target, smaller, prompt = oriented
    plain = [step.token for step in autoregressive_decode(target, prompt, 32)]
    for k in (2, 5, 8):
        cycles = list(speculative_decode(target, drafters(smaller)[name](), prompt, max_new_tokens=32, k=k))
        assert [t for c in cycles for t in c.emitted] == plain, k
    assert any(c.num_accepted for c in cycles)


@pytest.mark.parametrize("name", ["ngram", "draft model", "suffix"])
def test_sampled_speculation_on_oriented_layers_writes_plain_samplings_text(oriented, name):
    # Drafter-invariant sampling: the same text as plain sampling with the seed, on the same layers.
    target, smaller, prompt = oriented
    for seed in (0, 1):
        plain = [s.token for s in autoregressive_decode(target, prompt, 24, seed=seed, temperature=0.8)]
        for k in (3, 5):
            cycles = speculative_decode(target, drafters(smaller)[name](), prompt, max_new_tokens=24, k=k, seed=seed,
                                        temperature=0.8)
            assert [t for c in cycles for t in c.emitted] == plain, (seed, k)


def test_a_run_on_oriented_layers_writes_plain_decodings_text_and_says_what_was_measured():
    # Through the run path (warm-up, calibration, both methods): the orientation measured at load is in
    # the costs the run decided from, its JSON and Explain's words.
    import json
    from dataclasses import replace

    from specviz.models.tiny import tiny_pair
    from specviz.runs import run as runs
    from specviz.settings import RunSettings, validate
    from specviz.views.prose import calibration_text

    pair = tiny_pair("tiny")                        # built anew: orienting it touches no other test's
    chosen = orient_linears(pair.target, max_rows=5, rounds=1)
    lookup = replace(pair, draft=PromptLookupDrafter(), draft_name="prompt lookup", draft_parameters=0)
    settings = validate(RunSettings(target="tiny", draft="ngram", k=4, max_new_tokens=32, chat=False))
    run = runs.execute(settings, "the cat sat on the mat. the cat sat on the mat. the cat", lookup, baseline=True)
    assert [t for c in run.cycles for t in c.emitted] == [s.token for s in run.steps]
    decided = json.loads(json.dumps(run.summary()["decided_on"]))
    assert decided["transposed_rows"] == {f"{out}x{into}": rows for (out, into), rows in chosen.items()}
    rows = sorted({r for counts in chosen.values() for r in counts})     # none, on a host too busy to tell
    said = calibration_text(run)
    assert (f"products of {rows[0]}-{rows[-1]} rows oriented" in said) if rows else "oriented" not in said
