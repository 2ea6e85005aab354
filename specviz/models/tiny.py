"""A tiny Llama pair built in-process (random weights, a byte-level "tokenizer"): benchmarks and tests
that need no model files at all. Its forwards are so cheap that it measures mostly per-token overhead.

`tiny_pair` is the pair as a `ModelPair` (what `runs.race` takes), with `ByteTokenizer` standing in
for a tokenizer; the target name `sources.TINY_TARGET` ('tiny', as in `--target tiny`) builds it."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel

from ..errors import SpecvizError
from ..settings import DraftSpec, parse_draft
from .devices import DTYPES, resolve_device
from .pairs import ModelPair, make_drafter

TINY_VOCAB = 384       # bytes 0-255 plus unused ids
TINY_DRAFT_LAYERS = 2
TINY_TARGET_NAME = "tiny-llama"
TINY_DRAFT_NAME = "tiny-draft"
TINY_DRAFTS = ("tiny", TINY_DRAFT_NAME)   # draft specs naming the pair's own 2-layer draft model
TINY_DRAFT = parse_draft(TINY_DRAFT_NAME)   # the spec its draft model is made with, whichever of TINY_DRAFTS named it
CHAT_FRAME = "<user>\n{prompt}\n<assistant>\n"   # the tiny pair's minimal chat template


def tiny_models(seed: int = 0, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
                layers: int = 8, hidden: int = 128) -> tuple[PreTrainedModel, PreTrainedModel]:
    """A random-weight Llama target and a 2-layer draft that copies its embedding, first two layers,
    final norm and LM head. The target's later layers are damped (their output projections scaled
    by 0.03) so that they nudge the residual stream rather than overwrite it, the way trained deep
    layers often do; the draft then agrees with the target on most tokens (~80% accepted)."""
    torch.manual_seed(seed)
    # A large initializer_range spreads the logits, so that greedy argmax is not decided by float
    # round-off between one-token and multi-token forwards.
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=8192, initializer_range=0.3, tie_word_embeddings=False,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    target = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for layer in target.model.layers[TINY_DRAFT_LAYERS:]:
            layer.self_attn.o_proj.weight.mul_(0.03)
            layer.mlp.down_proj.weight.mul_(0.03)
    draft_config = LlamaConfig(**config.to_dict())
    draft_config.num_hidden_layers = TINY_DRAFT_LAYERS
    draft = LlamaForCausalLM(draft_config).eval()
    draft.load_state_dict(target.state_dict(), strict=False)   # the layers it lacks are skipped
    for model in (target, draft):
        model.generation_config.eos_token_id = None
        model.generation_config.pad_token_id = 0
    return target.to(device=device, dtype=dtype), draft.to(device=device, dtype=dtype)


def encode_bytes(prompt: str, chat: bool = True) -> torch.Tensor:
    """The tiny pair's tokenizer: UTF-8 bytes, in a minimal chat frame."""
    text = CHAT_FRAME.format(prompt=prompt) if chat else prompt
    return torch.tensor([list(text.encode())], dtype=torch.long)


class ByteTokenizer:
    """The tiny pair's tokenizer as `models.tokens` uses one: token i < 256 is byte i; the ids above
    (the models' unused vocabulary) decode to nothing. `chat_template` is only a marker that makes
    `encode_prompt` call `apply_chat_template`, which writes CHAT_FRAME."""

    chat_template = "byte-frame"

    def apply_chat_template(self, messages, tokenize: bool = False, add_generation_prompt: bool = True) -> str:
        return CHAT_FRAME.format(prompt=messages[-1]["content"])

    def __call__(self, text: str, return_tensors: str = "pt", add_special_tokens: bool = True) -> SimpleNamespace:
        return SimpleNamespace(input_ids=encode_bytes(text, chat=False))

    def decode(self, ids, skip_special_tokens: bool = False, clean_up_tokenization_spaces: bool = False) -> str:
        # An incomplete UTF-8 character decodes to U+FFFD, which is how Detokenizer knows to wait.
        return bytes(int(i) for i in ids if int(i) < 256).decode("utf-8", errors="replace")

    def __len__(self) -> int:
        return TINY_VOCAB


def tiny_pair(draft: DraftSpec | str | None = "tiny", *, device: str = "auto", dtype: str = "auto") -> ModelPair:
    """The tiny pair with a drafter: 'tiny' (its 2-layer draft model), 'ngram' or 'self:L'. Built anew
    on every call (a fraction of a second). dtype 'auto' is float32: the pair is for CPUs."""
    resolved = resolve_device(device)
    name = dtype.strip().lower()
    if name != "auto" and name not in DTYPES:
        raise SpecvizError(f"Unknown dtype {dtype!r}: use 'auto', 'float32', 'bfloat16' or 'float16'.")
    torch_dtype = torch.float32 if name == "auto" else DTYPES[name]
    spec = parse_draft(draft or "tiny")
    if spec.kind == "model" and spec.lower() not in TINY_DRAFTS:
        raise SpecvizError(f"Draft {spec!r} for the tiny target: use 'tiny' (its 2-layer draft model), "
                           "'ngram' or 'self:L'.")
    target, small = tiny_models(dtype=torch_dtype, device=resolved)
    drafter = make_drafter(TINY_DRAFT if spec.kind == "model" else spec, target,
                           target_name=TINY_TARGET_NAME, draft_model=small)
    return ModelPair(target=target, tokenizer=ByteTokenizer(), draft=drafter, target_name=TINY_TARGET_NAME,
                     draft_name=TINY_DRAFT_NAME if spec.kind == "model" else drafter.name,
                     target_parameters=sum(p.numel() for p in target.parameters()),
                     draft_parameters=drafter.parameters, device=target.device, dtype=torch_dtype, eos_token_ids=[])
