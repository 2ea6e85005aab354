"""The EAGLE-3 draft head (Li et al. 2025, arXiv 2503.01840), laid out as vLLM's `llama_eagle3` and the
`speculators` library store it, so that one folder drafts here and serves on vLLM.

What it reads: the target's hidden states at three depths, low / middle / high (transformers'
`output_hidden_states[i]` for i in `layer_ids`, by default (2, L // 2, L - 3) of L layers: the input of
those layers; distinct and below L, `layer_ids_problem`), concatenated and fused by `fc`
[hidden, 3 * target_hidden] into one feature per position.
Low layers still hold what the token is, high ones what comes next; EAGLE-1 read only the last layer's
state, which is already shaped for the target's own next token and carries less for the one after.

One decoder layer, in vLLM's order (`LlamaDecoderLayer` of llama_eagle3):
    embeds   = input_layernorm(embed(token i+1))            the target's embedding, shared
    x, res   = hidden_norm(h), h   (norm_before_residual: res = hidden_norm(h) too)
    attn     = o_proj(attention(q, k, v of [embeds; x]))    q/k/v read 2 * hidden
    res      = res + attn
    out      = res + mlp(post_attention_layernorm(res))     what the next drafting step reads as h
    logits   = lm_head(norm(out))                            over the draft vocabulary
    target id = draft id + d2t[draft id]
h is the fused target feature where the target has run, and the head's own `out` of the step before
where it has not (drafting past the first token): vLLM's proposer feeds the pre-norm output back.

Training-time test (`forward(..., steps=s)`): the drafting step s at position i reads step s - 1's
output at i - 1 and sees the true context up to i - s plus its own chain's keys of steps 1..s, exactly
what drafting s tokens deep sees."""

from __future__ import annotations

import copy
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb



def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Three distinct depths, low / middle / high: vLLM's default (2, L // 2, L - 3) from 7 layers on;
    below that it repeats a depth (6 layers: 2, 3, 3), and (0, L // 2, L - 1) is used instead (3 layers:
    0, 1, 2). A target of fewer than 3 layers has no three distinct depths below its last: ValueError
    (the layers above say it as a SpecvizError)."""
    if num_layers < 3:
        raise ValueError(f"An EAGLE-3 head reads three distinct hidden states of its target, below its last "
                         f"layer's output; a target of {num_layers} layer(s) has fewer. Use a draft model or "
                         "prompt lookup for it.")
    ids = (2, num_layers // 2, num_layers - 3)
    if not ids[0] < ids[1] < ids[2]:
        ids = (0, num_layers // 2, num_layers - 1)
    return ids


def layer_ids_problem(layer_ids, num_layers: int) -> str | None:
    """Why a head cannot read these hidden states of a target of `num_layers` layers (None when it can):
    the ids must be distinct and in 0..L-1. vLLM collects each id once (a repeat leaves `fc` short of
    input), and its state L is the last layer's output before the final norm, where transformers'
    `output_hidden_states[L]` is after it: the two engines would fuse different features."""
    ids = list(layer_ids)
    if len(set(ids)) != len(ids):
        return f"its layer ids {ids} repeat a layer (vLLM collects each once)"
    outside = [i for i in ids if not 0 <= i < num_layers]
    if outside:
        return (f"its layer ids {ids} include {outside}, outside 0..{num_layers - 1} (the inputs of the target's "
                f"{num_layers} layers; {num_layers}, the last one's output, is normed in transformers and not in vLLM)")
    return None


class _Attention(nn.Module):
    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.num_heads, self.num_kv_heads = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or h // self.num_heads
        self.q_proj = nn.Linear(2 * h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def project(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """(B, T, 2H) -> queries (B, nh, T, d), keys and values (B, nh, T, d) (kv heads repeated), rotated."""
        batch, length, _ = x.shape
        q = self.q_proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        repeat = self.num_heads // self.num_kv_heads
        if repeat > 1:
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return q, k, v


class _Layer(nn.Module):
    def __init__(self, config: LlamaConfig, norm_before_residual: bool):
        super().__init__()
        h, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm, self.hidden_norm = LlamaRMSNorm(h, eps=eps), LlamaRMSNorm(h, eps=eps)
        self.self_attn = _Attention(config)
        self.post_attention_layernorm = LlamaRMSNorm(h, eps=eps)
        self.mlp = LlamaMLP(config)
        self.norm_before_residual = norm_before_residual

    def inputs(self, embeds: torch.Tensor, hidden: torch.Tensor):
        """[input_layernorm(embeds); hidden_norm(hidden)] and the residual (vLLM's `_residual_norm`)."""
        normed = self.hidden_norm(hidden)
        residual = normed if self.norm_before_residual else hidden
        return torch.cat([self.input_layernorm(embeds), normed], dim=-1), residual

    def finish(self, attended: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """attention output (B, nh, T, d) -> the layer's pre-norm output (B, T, H)."""
        batch, _, length, _ = attended.shape
        residual = residual + self.self_attn.o_proj(attended.transpose(1, 2).reshape(batch, length, -1))
        return residual + self.mlp(self.post_attention_layernorm(residual))


class Eagle3Head(nn.Module):
    """The network (module docstring). Its state dict is the speculators file's: `fc.weight`,
    `layers.0.*`, `norm.weight`, `lm_head.weight`, `d2t`, `t2d`; the embedding is the target's (`bind`)."""

    def __init__(self, layer_config: LlamaConfig, *, draft_vocab_size: int, target_hidden_size: int,
                 layer_ids: tuple[int, ...], norm_before_residual: bool = False):
        super().__init__()
        self.layer_config = layer_config
        self.draft_vocab_size, self.target_hidden_size = draft_vocab_size, target_hidden_size
        self.hidden_layers = tuple(layer_ids)          # the loop hands over these (core.drafters.Drafter)
        self.norm_before_residual = norm_before_residual
        h = layer_config.hidden_size
        self.fc = nn.Linear(len(layer_ids) * target_hidden_size, h, bias=False)
        self.layers = nn.ModuleList([_Layer(layer_config, norm_before_residual)])
        self.norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(layer_config.vocab_size, dtype=torch.bool))
        self.register_buffer("vocab", torch.arange(draft_vocab_size), persistent=False)  # draft id -> target id
        self.rotary = LlamaRotaryEmbedding(layer_config)
        self._target_embedding: tuple[nn.Module, ...] = ()   # the target's, outside the registry: not saved

    @property
    def target_vocab_size(self) -> int:
        return self.layer_config.vocab_size

    def set_vocab(self, target_ids: torch.Tensor) -> Eagle3Head:
        """The draft vocabulary: draft id i is target id target_ids[i] (sorted ascending, as d2t assumes
        nothing else but vLLM and speculators write them so)."""
        target_ids = target_ids.to(self.d2t.device)
        self.d2t.copy_(target_ids - torch.arange(target_ids.numel(), device=target_ids.device))
        self.t2d.zero_()
        self.t2d[target_ids] = True
        return self.refresh_vocab()

    def refresh_vocab(self) -> Eagle3Head:
        """`vocab` from `d2t` (after loading weights)."""
        self.vocab = torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t
        return self

    def bind(self, target) -> Eagle3Head:
        """Share the target's input embedding (never trained here, not saved)."""
        self._target_embedding = (target.get_input_embeddings(),)
        return self

    @property
    def dtype(self) -> torch.dtype:
        """What the head computes in (its norms' dtype: an `int8_copy`'s products take float32 too)."""
        return self.norm.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.norm.weight.device

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self._target_embedding[0](tokens).to(self.dtype)

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """The target's concatenated hidden states (..., 3 * target_hidden) -> the head's feature (..., H)."""
        return self.fc(aux.to(self.dtype))

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        """(..., H) pre-norm outputs -> (..., draft_vocab) logits."""
        normed = self.norm(out)
        if normed.dim() == 1:           # one position (an int8 product takes a matrix)
            return self.lm_head(normed[None])[0]
        return self.lm_head(normed)

    def _rotary(self, x: torch.Tensor, positions: torch.Tensor):
        cos, sin = self.rotary(x, positions[None])
        return cos, sin

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, start: int = 0,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """features (B, T, H): h at each position (fused target features, or the head's own outputs);
        tokens (B, T): token i+1; positions start..start+T-1 unless `positions` (T,) is given. Returns
        (pre-norm outputs (B, T, H), (keys, values) of all positions so far). cache: earlier positions'
        keys and values (the new ones see them and each other causally, unless `mask` (T, P + T) says
        which each sees: a tree)."""
        layer = self.layers[0]
        x, residual = layer.inputs(self.embed(tokens), features)
        length = x.shape[1]
        if positions is None:
            positions = torch.arange(start, start + length, device=x.device)
        q, k, v = layer.self_attn.project(x, *self._rotary(x, positions))
        if cache is not None:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        if mask is None:
            mask = torch.ones(length, k.shape[2], dtype=torch.bool, device=x.device).tril(k.shape[2] - length)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return layer.finish(attended, residual), (k, v)

    def unrolled(self, fused: torch.Tensor, tokens: torch.Tensor, steps: int) -> list[torch.Tensor]:
        """Training-time test over whole sequences with their real positions: the outputs (B, T, H) of
        drafting steps 0..steps-1 at every position (module docstring). Step s at position i reads step
        s - 1's output at i - 1 and attends to the true keys at positions <= i - s and its own chain's
        keys of steps 1..s (each at its own position); rows with i < s have no such chain (score none)."""
        layer = self.layers[0]
        embeds = self.embed(tokens)
        length = fused.shape[1]
        positions = torch.arange(length, device=fused.device)
        cos, sin = self._rotary(fused, positions)
        scale = layer.self_attn.head_dim ** -0.5
        outs, keys, values = [], [], []
        hidden = fused
        for step in range(steps):
            x, residual = layer.inputs(embeds, hidden)
            q, k, v = layer.self_attn.project(x, cos, sin)
            keys.append(k), values.append(v)
            # True context: step 0's keys at positions <= i - step (position 0 always, so no row is empty).
            seen = torch.ones(length, length, dtype=torch.bool, device=x.device).tril(-step)
            seen[:, 0] = True
            scores = [(q @ keys[0].transpose(-1, -2) * scale).masked_fill(~seen, float("-inf"))]
            chain = []
            for r in range(1, step + 1):     # step r's key of this chain sits step - r positions earlier
                shifted_k = F.pad(keys[r], (0, 0, step - r, 0))[:, :, :length]
                shifted_v = F.pad(values[r], (0, 0, step - r, 0))[:, :, :length]
                scores.append((q * shifted_k).sum(-1, keepdim=True) * scale)
                chain.append(shifted_v)
            weights = torch.softmax(torch.cat(scores, dim=-1).float(), dim=-1).to(x.dtype)
            attended = weights[..., :length] @ values[0]
            for r, shifted_v in enumerate(chain):
                attended = attended + weights[..., length + r:length + r + 1] * shifted_v
            out = layer.finish(attended, residual)
            outs.append(out)
            hidden = F.pad(out[:, :-1], (0, 0, 1, 0))     # step s + 1 at i reads step s's output at i - 1
        return outs


def int8_copy(head: Eagle3Head) -> Eagle3Head | None:
    """A copy of `head` to draft with on a CPU, its products (fc, the layer's, lm_head) in int8: weights
    quantized per output row, each input per call (torch's dynamic quantization, fbgemm / x86 kernels).
    Drafting one token reads every weight of the head once (40 MB in float32 for the built-in's), so it
    is bound by memory: the int8 copy reads a quarter of that. The copy drafts nearly the same tokens
    (its drafts are only proposals: the target verifies every one, so outputs stay exact; sampled
    drafts are drawn from the copy's own distribution, which verification uses). It computes in float32;
    the target's embedding stays shared. The head itself is untouched (training goes on from it).
    None where this torch has no int8 kernels for this CPU."""
    engines = getattr(torch.backends, "quantized", None)
    dynamic = getattr(getattr(torch, "ao", None), "quantization", None)
    if engines is None or dynamic is None or not {"x86", "fbgemm"} & set(engines.supported_engines):
        return None
    embedding, head._target_embedding = head._target_embedding, ()
    try:
        floating = copy.deepcopy(head).to(device="cpu", dtype=torch.float32).eval()
    finally:
        head._target_embedding = embedding
    try:
        with warnings.catch_warnings():     # deprecated for torchao's, still torch's own here
            warnings.simplefilter("ignore")
            quantized = dynamic.quantize_dynamic(
                floating, {nn.Linear: dynamic.per_channel_dynamic_qconfig}, dtype=torch.qint8)
    except (RuntimeError, AttributeError, NotImplementedError):
        return None
    quantized._target_embedding = embedding
    return quantized
