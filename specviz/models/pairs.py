"""A target and a drafter for one run: `make_drafter` turns a draft spec into a drafter for a loaded
target, `load_pair` loads (or takes from the cache) both. A draft model with the target's vocabulary
drafts token ids; one with another vocabulary drafts across tokenizers (its text re-tokenized each
cycle, core.cross_tokenizer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from ..core.cross_tokenizer import CrossTokenizerDrafter
from ..core.drafters import Drafter, DraftModelDrafter, PromptLookupDrafter, early_exit_model
from ..core.head import HeadDrafter
from ..core.hybrid import HybridDrafter, components
from ..core.lookup_trees import NgramTreeDrafter, SuffixDrafter
from ..errors import SpecvizError
from ..settings import DraftSpec, parse_draft
from .cache import lock as _lock
from .cpu_linear import orient_linears
from .devices import resolve_device
from .head_files import has_shipped_head, spec_location
from .heads import INT8_ENV, load_head
from .loading import fit_on_gpu, load_cached, pick_dtype
from .sources import (
    DEFAULT_TARGET,
    Progress,
    Source,
    report,
    resolve_source,
    span,
)


@dataclass(frozen=True)
class ModelPair:
    target: PreTrainedModel
    tokenizer: Any                # the target's tokenizer (the draft shares its vocabulary)
    draft: Drafter                # pass as `draft` to speculative_decode
    target_name: str
    draft_name: str
    target_parameters: int
    draft_parameters: int         # what the draft runs: 0 for ngram, shared layers for self:L
    device: torch.device
    dtype: torch.dtype
    eos_token_ids: list[int]      # generation_config's EOS plus the chat template's end of turn
    note: str = ""                # one line about how the pair drafts, shown by the page and the CLI

HEAD_INT8_NOTE = (f"the head drafts with int8 weights on this CPU (a quarter of float32's bytes to read per drafted "
                  f"token; the target verifies every draft: outputs unchanged); {INT8_ENV}=0 drafts in float")
CROSS_TOKENIZER_NOTE = "draft and target tokenizers differ: drafting across tokenizers (text re-tokenized each cycle)"


def vocabulary_mismatch(target_tokenizer, draft_tokenizer) -> str | None:
    """None when both tokenizers map the same strings to the same ids, else an example difference."""
    target_vocab, draft_vocab = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    if target_vocab == draft_vocab:
        return None
    differing = [t for t in target_vocab if draft_vocab.get(t) != target_vocab[t]]
    detail = (f"the target has {len(target_vocab)} tokens, the draft {len(draft_vocab)}; {len(differing)} of the "
              "target's are missing from the draft or have another id there")
    if differing:
        token = min(differing, key=target_vocab.get)
        where = "absent" if token not in draft_vocab else f"id {draft_vocab[token]}"
        detail += f", e.g. {token!r} is id {target_vocab[token]} in the target and {where} in the draft"
    else:
        token = min((t for t in draft_vocab if t not in target_vocab), key=draft_vocab.get)
        detail += f", and the draft has {token!r} (id {draft_vocab[token]}), which the target lacks"
    return detail


def _token_strings(tokenizer) -> set[str]:
    """A tokenizer's token strings, special tokens left out, with the usual word-start markers
    (SentencePiece's and byte-level BPE's) read as a space: close enough to compare two
    vocabularies by string."""
    special = set(getattr(tokenizer, "all_special_tokens", ()))
    return {token.replace("\u2581", " ").replace("\u0120", " ") for token in tokenizer.get_vocab()
            if token not in special}


def shared_vocabulary(target_tokenizer, draft_tokenizer) -> float:
    """The share of the draft's token strings that are also target tokens (0 to 1)."""
    draft_strings = _token_strings(draft_tokenizer)
    return len(draft_strings & _token_strings(target_tokenizer)) / max(len(draft_strings), 1)


def check_overlap(target_tokenizer, draft_tokenizer, *, draft_name: str, target_name: str) -> None:
    """Refuse a cross-tokenizer draft whose vocabulary shares no string with the target's."""
    if shared_vocabulary(target_tokenizer, draft_tokenizer) == 0:
        raise SpecvizError(
            f"The draft {draft_name} and {target_name} have no token string in common: the draft's text "
            "cannot be re-tokenized for the target. Pick a draft model for the same language and script, "
            "or the draft 'ngram' or 'self:L'.")


def end_of_turn_id(tokenizer) -> int | None:
    """The token the chat template closes an assistant turn with (<|im_end|>, <|eot_id|>,
    <end_of_turn>, ...), found by rendering a turn and reading what follows its text."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    marker = "SPECVIZ_END_OF_TURN_PROBE"
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"},
                                              {"role": "assistant", "content": marker}], tokenize=False)
    except Exception:   # noqa: BLE001 - templates may reject any conversation; then there is no such token
        return None
    if marker not in text:
        return None
    tail = text.split(marker, 1)[1].lstrip()
    added = sorted((str(t) for t in getattr(tokenizer, "added_tokens_decoder", {}).values()), key=len, reverse=True)
    token = next((t for t in added if t and tail.startswith(t)), None)
    return None if token is None else tokenizer.convert_tokens_to_ids(token)


def eos_token_ids(model: PreTrainedModel, tokenizer) -> list[int]:
    configured = getattr(model.generation_config, "eos_token_id", None)
    if configured is None:
        configured = getattr(tokenizer, "eos_token_id", None)
    ids = [] if configured is None else [configured] if isinstance(configured, int) else list(configured)
    end_of_turn = end_of_turn_id(tokenizer)
    if end_of_turn is not None and end_of_turn not in ids:
        ids.append(end_of_turn)
    return ids


def make_drafter(spec: DraftSpec | str | None, target: PreTrainedModel, *, target_name: str = "the target",
                 draft_model: PreTrainedModel | None = None, target_tokenizer=None,
                 draft_tokenizer=None) -> Drafter:
    """The drafter a draft spec names, for a loaded target: prompt lookup for 'ngram', the target's
    first L layers for 'self:L', and for a model spec the already loaded `draft_model`. A draft
    whose embedding matrix is padded to another size than the target's is fine: the drafter cuts or
    pads its distribution to the target's vocabulary. Given both tokenizers, a draft whose
    vocabulary differs from the target's drafts across tokenizers. 'head' is the draft head shipped for
    the target (refused for a target with none), 'head:DIR' a trained head (models.heads); 'auto' the
    hybrid of prompt lookup, suffix decoding and the shipped head where there is one."""
    draft = parse_draft(spec)
    vocab_size = target.config.get_text_config().vocab_size
    if draft.kind == "ngram":
        return PromptLookupDrafter(max_ngram=3)
    if draft.kind == "ngram-tree":
        return NgramTreeDrafter(max_ngram=3)
    if draft.kind == "suffix":
        return SuffixDrafter()
    if draft.kind == "auto":
        inner = None if draft.inner is None else make_drafter(draft.inner, target, target_name=target_name)
        return hybrid_drafter(target, target_name, inner)
    if draft.kind == "self":
        try:
            view = early_exit_model(target, draft.layers)
        except ValueError as error:
            raise SpecvizError(f"Draft {draft!r} for {target_name}: {error}.") from None
        return DraftModelDrafter(view, vocab_size=vocab_size, name=draft)
    if draft.kind == "head":
        return load_head(spec_location(draft, target_name), target, target_name=target_name, name=draft)
    if draft_model is None:
        raise SpecvizError(f"Draft {draft!r} is a model: load it first (load_pair does).")
    name = resolve_source(draft).name
    if target_tokenizer is not None and draft_tokenizer is not None and \
            vocabulary_mismatch(target_tokenizer, draft_tokenizer):
        check_overlap(target_tokenizer, draft_tokenizer, draft_name=name, target_name=target_name)
        return CrossTokenizerDrafter(draft_model, draft_tokenizer, target_tokenizer, name=name,
                                     target_vocab_size=vocab_size)
    return DraftModelDrafter(draft_model, vocab_size=vocab_size, name=name)


def drafting_note(drafter: Drafter) -> str:
    """The pair's note where a head drafts with int8 products (`core.eagle3.int8_copy`), else ""."""
    if any(isinstance(part, HeadDrafter) and part.weights == "int8" for part in components(drafter)):
        return HEAD_INT8_NOTE
    return ""


def hybrid_drafter(target: PreTrainedModel, target_name: str, inner: Drafter | None = None) -> HybridDrafter:
    """'auto': prompt lookup, suffix decoding and `inner` (early exit or a head) or else, where one ships
    for the target, its trained head; each cycle the one expected to pay most (core.hybrid), suffix
    decoding where both copies pay unless prompt lookup has clearly paid more (core.copy_record)."""
    drafters: list[Drafter] = [PromptLookupDrafter(max_ngram=3), SuffixDrafter()]
    if inner is not None:
        drafters.append(inner)
    elif has_shipped_head(target_name):
        head = parse_draft("head")
        drafters.append(load_head(spec_location(head, target_name), target, target_name=target_name, name=head))
    return HybridDrafter(drafters, name=parse_draft("auto"), prefer="suffix", both=True)


def load_pair(target: str | None = None, draft: DraftSpec | str | None = None, *, device: str | torch.device = "auto",
              dtype: str | torch.dtype = "auto", allow_pickle: bool = False, trust_remote_code: bool = False,
              progress: Progress | None = None) -> ModelPair:
    """A target and a draft for `speculative_decode`. target: built-in name, hub id, folder or .gguf
    (default: the built-in SmolLM2-135M-Instruct). draft: the same kinds of model, 'ngram' (prompt
    lookup) or 'self:L' (the target's first L layers); default 'ngram'."""
    target = target or DEFAULT_TARGET
    if parse_draft(target).kind != "model":
        raise SpecvizError(f"{target!r} is a kind of draft, not a model: the target must be a model "
                           f"(e.g. {DEFAULT_TARGET!r}).")
    spec = parse_draft(draft)
    options = dict(allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    with _lock:
        resolved_device = resolve_device(device)
        resolved_dtype = pick_dtype(target, resolved_device, dtype, trust_remote_code=trust_remote_code)
        with_draft = spec.kind == "model"
        # On a GPU, one budget for both models and their caches, checked before any loads.
        fit_on_gpu([target, spec] if with_draft else [target], resolved_device, resolved_dtype,
                   trust_remote_code=trust_remote_code)
        (target_model, tokenizer), target_key = load_cached(
            target, resolved_device, resolved_dtype, progress=span(progress, 0.0, 0.6 if with_draft else 1.0),
            **options)
        target_name = resolve_source(target).name
        draft_model = draft_tokenizer = None
        if with_draft:
            def vet(draft_tokenizer, source: Source) -> None:   # before the draft's weights load
                if vocabulary_mismatch(tokenizer, draft_tokenizer):
                    check_overlap(tokenizer, draft_tokenizer, draft_name=source.name, target_name=target_name)

            (draft_model, draft_tokenizer), _ = load_cached(spec, resolved_device, resolved_dtype,
                                                            progress=span(progress, 0.6, 1.0), vet=vet,
                                                            keep={target_key}, **options)
            draft_rows = draft_model.config.get_text_config().vocab_size
            if draft_rows < len(draft_tokenizer):
                raise SpecvizError(f"The draft {resolve_source(spec).name} has {draft_rows} embedding rows, fewer "
                                   f"than the {len(draft_tokenizer)} tokens of its tokenizer: the checkpoint is "
                                   "inconsistent.")
        if resolved_device.type == "cpu":     # few-row products in this CPU's faster orientation (measured once)
            for model in filter(None, (target_model, draft_model)):
                orient_linears(model)
        drafter = make_drafter(spec, target_model, target_name=target_name, draft_model=draft_model,
                               target_tokenizer=tokenizer, draft_tokenizer=draft_tokenizer)
        note = CROSS_TOKENIZER_NOTE if isinstance(drafter, CrossTokenizerDrafter) else drafting_note(drafter)
        if note:
            report(progress, 1.0, note)
        return ModelPair(target=target_model, tokenizer=tokenizer, draft=drafter, target_name=target_name,
                         draft_name=drafter.name, target_parameters=sum(p.numel() for p in target_model.parameters()),
                         draft_parameters=drafter.parameters, device=target_model.device, dtype=resolved_dtype,
                         eos_token_ids=eos_token_ids(target_model, tokenizer), note=note)
