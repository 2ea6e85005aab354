"""A tiny model pair for the compare, export, teach and tabs tests: a word-level tokenizer and
Llama models built in-process from a config (nothing downloaded)."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import make_llama, truncated_copy
from specviz.drafters import DraftModelDrafter, PromptLookupDrafter, early_exit_model
from specviz.models import ModelLoadError, ModelPair
from specviz.runs import RunConfig

WORDS = ("<unk> <eos> the a cat dog sat ran on in mat park and then big small red blue sun sea "
         "sky tree bird sang flew over under near far old new day night . , ! ?").split()
PROMPT = "the cat sat on the mat and the dog sat on the mat and the cat sat on the"


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")


class TinyModels:
    """Stands in for `specviz.models.load_pair` (`load(target, draft, progress=None)`). Drafts:
    "ngram", "self:L", "small" (a 1-layer truncated copy of the target), "same" (the target
    itself: every draft accepted) and "random" (an unrelated model: almost none accepted)."""

    def __init__(self):
        self.tokenizer = tiny_tokenizer()
        vocab = len(WORDS)
        self.target = make_llama(0, layers=4, vocab=vocab)
        self.small = truncated_copy(self.target, 1)
        self.random = make_llama(7, layers=1, vocab=vocab)
        self.calls: list[tuple] = []

    def drafter(self, draft: str | None):
        draft = draft or "ngram"
        if draft == "ngram":
            return PromptLookupDrafter(max_ngram=3)
        if draft.startswith("self:"):
            return DraftModelDrafter(early_exit_model(self.target, int(draft[5:])), name=draft)
        models_by_name = {"small": self.small, "same": self.target, "random": self.random}
        if draft not in models_by_name:
            raise ModelLoadError(f"{draft!r} does not exist.")
        return DraftModelDrafter(models_by_name[draft], name=draft)

    def __call__(self, target=None, draft=None, progress=None):
        self.calls.append((target, draft))
        if target not in (None, "tiny"):
            raise ModelLoadError(f"{target!r} does not exist: no such file or folder.")
        return ModelPair(target=self.target, tokenizer=self.tokenizer, draft=self.drafter(draft),
                         target_name="tiny", draft_name=draft or "ngram", target_parameters=1, draft_parameters=0,
                         device=self.target.device, dtype=torch.float32, eos_token_ids=[])

    def for_config(self, config: RunConfig):
        """`load` for specviz.compare: config -> pair."""
        return self(config.target, config.draft)
