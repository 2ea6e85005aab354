"""The one tiny model pair every fast test uses (exposed as the `tiny` fixture in conftest): a
word-level tokenizer with a chat template, and Llama models built in-process from a config
(nothing downloaded). `TinyModels.loader` stands in for `specviz.runs.load`."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from conftest import make_llama, reordered_copy, truncated_copy
from specviz.core.cross_tokenizer import CrossTokenizerDrafter
from specviz.core.drafters import DraftModelDrafter
from specviz.errors import SpecvizError
from specviz.models import ModelPair, make_drafter
from specviz.models.pairs import CROSS_TOKENIZER_NOTE
from specviz.settings import RunSettings, parse_draft

WORDS = ("<unk> <eos> the a cat dog sat ran on in mat park and then big small red blue sun sea "
         "sky tree bird sang flew over under near far old new day night . , ! ? <user> <assistant>").split()
PROMPT = "the cat sat on the mat and the dog sat on the mat and the cat sat on the"
CHAT_TEMPLATE = ("{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} {% endfor %}"
                 "{% if add_generation_prompt %}<assistant> {% endif %}")


def tiny_tokenizer(words=WORDS) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


class TinyModels:
    """Targets: None or "tiny" (4 layers), "short-context" (a 32-token context); anything else
    fails as a missing model would. Drafts: "ngram", "self:L", "small" (a 1-layer truncated copy
    of the target), "same" (the target itself: every draft accepted) and "random" (an unrelated
    model: almost none accepted). `calls` records every (target, draft) asked for."""

    def __init__(self):
        self.tokenizer = tiny_tokenizer()
        vocab = len(WORDS)
        self.target = make_llama(0, layers=4, vocab=vocab)
        self.short = make_llama(0, layers=4, vocab=vocab, context=32)
        self.small = truncated_copy(self.target, 1)
        self.random = make_llama(7, layers=1, vocab=vocab)
        # Reversed ids and no chat template: the draft reads the target's chat text, markers included.
        self.other_tokenizer = tiny_tokenizer(list(reversed(WORDS)))
        self.other_tokenizer.chat_template = None
        self.other = reordered_copy(self.target, self.tokenizer, self.other_tokenizer)
        self.calls: list[tuple] = []

    def drafter(self, draft: str | None, target):
        spec = parse_draft(draft)
        if spec.kind != "model":                  # ngram, ngram-tree, self:L: as the app makes them
            return make_drafter(draft, target, target_name="tiny")
        if spec.text == "other-tokenizer":
            # cut_last: the views' tests need cycles whose last target token the alignment cut.
            return CrossTokenizerDrafter(self.other, self.other_tokenizer, self.tokenizer, name=spec.text,
                                         cut_last=True)
        models_by_name = {"small": self.small, "same": target, "random": self.random}
        if spec.text not in models_by_name:
            raise SpecvizError(f"{spec.text!r} does not exist.")
        return DraftModelDrafter(models_by_name[spec.text], name=spec.text)

    def pair(self, target=None, draft=None, progress=None) -> ModelPair:
        self.calls.append((target, draft))
        if progress is not None:
            progress(0.5, "loading the tiny model")
        if target not in (None, "tiny", "short-context"):
            raise SpecvizError(f"{target!r} does not exist: no such file or folder.")
        model = self.short if target == "short-context" else self.target
        drafter = self.drafter(draft, model)
        return ModelPair(target=model, tokenizer=self.tokenizer, draft=drafter,
                         target_name=target or "tiny", draft_name=parse_draft(draft).name, target_parameters=1,
                         draft_parameters=0, device=model.device, dtype=torch.float32, eos_token_ids=[],
                         note=CROSS_TOKENIZER_NOTE if isinstance(drafter, CrossTokenizerDrafter) else "")

    def loader(self, settings: RunSettings, progress=None) -> ModelPair:
        """Stands in for `specviz.runs.load`."""
        return self.pair(settings.target, settings.draft, progress)
