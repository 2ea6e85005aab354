"""Drafting with a trained draft head: chains (`HeadDrafter`, alone and batched) and EAGLE-2 token
trees (`HeadTreeDrafter`), for either network:

- `core.eagle3.Eagle3Head` (EAGLE-3, what specviz trains and writes, in the speculators format vLLM
  serves): reads the target's hidden states at three layers, fused;
- `DraftHead` below (EAGLE-1 shaped, Li et al. 2024, arXiv 2401.15077: the first specviz heads, still
  loaded for the shipped head): reads the target's last hidden state f_i (after the final norm) and
  predicts f_{i+1}; the target's LM head rows of a reduced draft vocabulary turn it into a token.

At position i a head reads (the target's feature of position i, the embedding of token i+1, the
target's own embedding matrix, shared); drafting further it reads its own output of the step before in
place of the target's feature. It is cheap (one layer where the target has many; a few thousand output
rows where the target has its whole vocabulary) and agrees with the target because the target's hidden
states already hold most of what decides the next tokens.

The drafter needs the target's hidden states of the accepted positions: the decoding loop hands them
over after each verification (`Drafter.observe`, the layers named by `Drafter.hidden_layers`). The very
first cycle has none yet (the prompt has not been through the target), so it drafts nothing.

Exactness: a sampled draft token is drawn from the head's warped distribution over the draft
vocabulary, scattered into the target's vocabulary (zero elsewhere); that is the distribution it was
drawn from, so the verification's rejection sampling stays exact. Trees: depth by depth the most
probable nodes grow their most probable children, one head forward per depth under a tree mask;
verified as one-hot candidates, so exact too."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from . import trees
from .drafters import Draft, Drafter, no_draft
from .eagle3 import Eagle3Head
from .request import Request
from .sampling import Sampler, sample_from


@dataclass(frozen=True)
class HeadConfig:
    hidden_size: int            # the target's hidden size (the head's width)
    num_heads: int              # attention heads of the head's one layer
    intermediate_size: int      # its MLP's width
    target_vocab_size: int      # the target's vocabulary (draft ids map into it)
    target_layers: int          # the target's layer count (a head for another target is refused)
    draft_vocab_size: int       # rows of the reduced output layer
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def to_dict(self) -> dict:
        return asdict(self)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class DraftHead(nn.Module):
    """The network: fc([norm(f), norm(e)]) -> one pre-norm Llama block (attention with rotary
    positions, SwiGLU MLP) -> the predicted next feature. Its weights are the only ones it owns; the
    target's embedding and the LM head rows are handed in (`bind`), not saved with it."""

    def __init__(self, config: HeadConfig):
        super().__init__()
        self.config = config
        h, eps = config.hidden_size, config.rms_norm_eps
        self.head_dim = h // config.num_heads
        self.feature_norm, self.embed_norm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.attn_norm, self.mlp_norm = nn.RMSNorm(h, eps=eps), nn.RMSNorm(h, eps=eps)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.gate_up = nn.Linear(h, 2 * config.intermediate_size, bias=False)
        self.down = nn.Linear(config.intermediate_size, h, bias=False)
        # draft id -> target id (saved with the weights: it is what the head was trained to draft)
        self.register_buffer("vocab", torch.zeros(config.draft_vocab_size, dtype=torch.long))
        # The target's embedding, held outside the module's registry: it is neither trained nor saved.
        self._target_embedding: tuple[nn.Module, ...] = ()
        self.lm_rows: torch.Tensor | None = None            # (draft_vocab, hidden): the target's LM head rows
        inv = 1.0 / (config.rope_theta ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        self.register_buffer("inv_freq", inv, persistent=False)

    hidden_layers = (-1,)            # the target's last hidden state, after its final norm

    @property
    def target_vocab_size(self) -> int:
        return self.config.target_vocab_size

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's features as this head reads them (EAGLE-3 fuses three layers here)."""
        return features.to(self.fc.weight.dtype)

    def bind(self, target) -> DraftHead:
        """Share the target's embedding and take its LM head rows of the draft vocabulary."""
        self._target_embedding = (target.get_input_embeddings(),)
        weight = target.get_output_embeddings().weight
        self.lm_rows = weight.detach()[self.vocab.to(weight.device)].to(self.fc.weight.dtype)
        return self

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():                 # the target's: never trained here (in the head's dtype)
            return self._target_embedding[0](tokens).to(self.fc.weight.dtype)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """(..., H) features -> (..., draft_vocab) logits."""
        return features @ self.lm_rows.T

    def forward(self, features: torch.Tensor, tokens: torch.Tensor, start: int = 0,
                cache: tuple[torch.Tensor, torch.Tensor] | None = None,
                context: tuple[torch.Tensor, torch.Tensor] | None = None,
                positions: torch.Tensor | None = None, mask: torch.Tensor | None = None):
        """features (B, T, H): f_i; tokens (B, T): token i+1; positions start..start+T-1. Returns
        (predicted features (B, T, H), (keys, values) of these positions).

        cache: earlier positions' keys and values (drafting: the new positions see them and each
        other causally). context (training the second drafting step): keys and values of the same
        positions computed from the true features; position i then sees context positions < i and
        itself only, exactly what a second drafting step sees. positions (T,) and mask (T, P + T: which
        cached and new positions each new one sees) replace the consecutive positions and the causal
        mask (drafting a tree: each node sees the prefix and its own ancestors)."""
        x = self.fc(torch.cat([self.feature_norm(features), self.embed_norm(self.embed(tokens))], dim=-1))
        batch, length, _ = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(batch, length, 3, self.config.num_heads,
                                                   self.head_dim).permute(2, 0, 3, 1, 4)
        if positions is None:
            positions = torch.arange(start, start + length, device=x.device)
        positions = positions.to(torch.float32)
        angles = positions[:, None] * self.inv_freq[None]
        cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        if context is not None:
            keys, values = context
            scores = q @ keys.transpose(-1, -2) / self.head_dim ** 0.5               # (B, nh, T, T)
            earlier = torch.ones(length, length, dtype=torch.bool, device=x.device).tril(-1)
            scores = scores.masked_fill(~earlier, float("-inf"))
            own = (q * k).sum(-1, keepdim=True) / self.head_dim ** 0.5             # (B, nh, T, 1)
            weights = torch.softmax(torch.cat([scores, own], dim=-1).float(), dim=-1).to(x.dtype)
            attended = weights[..., :length] @ values + weights[..., length:] * v
        else:
            if cache is not None:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            # New positions see every cached one and each other causally.
            if mask is None:
                past = k.shape[2] - length
                mask = torch.ones(length, k.shape[2], dtype=torch.bool, device=x.device).tril(past)
            attended = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.o(attended.transpose(1, 2).reshape(batch, length, -1))
        gate, up = self.gate_up(self.mlp_norm(x)).chunk(2, dim=-1)
        x = x + self.down(F.silu(gate) * up)
        return x, (k, v)


# ----------------------------------------------------------------------------- the drafter

class _HeadState:
    """One request's: the target's features of its positions so far, and the head's keys and values."""

    def __init__(self):
        self.features: list[torch.Tensor] = []    # (n, H) blocks, in position order
        self.count = 0                            # positions with a target feature
        self.keys: torch.Tensor | None = None     # (1, nh, P, d) the head's keys and values, of which
        self.values: torch.Tensor | None = None   # the first `true` positions were computed from true features
        self.true = 0

    def crop_features(self, length: int) -> None:
        if self.count > length:
            stacked = torch.cat(self.features)[:length]
            self.features, self.count = [stacked], length

    def feature(self, start: int, end: int) -> torch.Tensor:
        stacked = torch.cat(self.features) if len(self.features) > 1 else self.features[0]
        self.features = [stacked]
        return stacked[start:end]


class HeadDrafter(Drafter):
    """Drafts a chain with a trained `DraftHead` from the target's features (module docstring). Keeps
    per request its features and head cache; a batch drafts each request in turn (the head's
    forward is small: batching its rows would save little on a CPU)."""

    batchable = True

    def __init__(self, head: DraftHead | Eagle3Head, name: str = "head"):
        self.head = head.eval()
        self.name = name
        self.hidden_layers = head.hidden_layers
        borrowed = getattr(head, "lm_rows", None)           # EAGLE-1 heads take the target's LM head rows
        self.parameters = sum(p.numel() for p in head.parameters()) + (0 if borrowed is None else borrowed.numel())
        self.states: list[_HeadState] = []
        self._target_vocab = head.target_vocab_size

    def begin_batch(self, prompts: Sequence[list[int]]) -> None:
        self.states = [_HeadState() for _ in prompts]

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.begin_batch([prompt_ids[0].tolist()])

    @torch.inference_mode()
    def observe(self, hidden: Sequence[torch.Tensor]) -> None:
        for state, block in zip(self.states, hidden):
            if block.shape[0]:
                state.features.append(self.head.fuse(block))
                state.count += block.shape[0]

    def rollback_batch(self, lengths: Sequence[int]) -> bool:
        for state, length in zip(self.states, lengths):
            state.crop_features(length)
        return False

    def rollback(self, valid_length: int) -> None:
        self.rollback_batch([valid_length])

    def leave(self, staying: Sequence[int]) -> bool:
        self.states = [self.states[row] for row in staying]
        return False

    def propose_batch(self, requests: Sequence[Request]) -> list[Draft]:
        return [self._draft(state, r.tokens, r.budget, r.sampler) for state, r in zip(self.states, requests)]

    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        return self._draft(self.states[0], sequence[0].tolist(), k, sampler)

    def prime(self, state: _HeadState, tokens: list[int]):
        """Feed the head what it lacks of the request's true features, up to the newest token: returns
        the predicted feature of the newest token's position (1, 1, H) and the head's keys and values,
        or None while the target has given no features yet (the first cycle)."""
        length = len(tokens)
        # The target's features cover positions 0..count-1; the newest token (length-1) has none yet.
        if length < 2 or state.count < length - 1 or state.count == 0:
            return None
        head = self.head
        # Head position i reads (f_i, token i+1): the cache holds positions computed from true features;
        # the ones it lacks (those accepted since; at least the last, whose output drafts) are fed now.
        have = min(state.true, length - 2)
        cache = None if not have else (state.keys[:, :, :have], state.values[:, :, :have])
        features = state.feature(have, length - 1)[None]
        ids = torch.tensor([tokens[have + 1:length]], device=head.fc.weight.device)
        out, (keys, values) = head(features, ids, start=have, cache=cache)
        state.keys, state.values, state.true = keys, values, length - 1
        return out[:, -1:], keys, values

    @torch.inference_mode()
    def _draft(self, state: _HeadState, tokens: list[int], k: int, sampler: Sampler) -> Draft:
        primed = self.prime(state, tokens) if k > 0 else None
        if primed is None:
            return no_draft()
        head = self.head
        device = head.fc.weight.device
        feature, keys, values = primed
        position = len(tokens) - 1
        drafted, rows = [], []
        for step in range(k):
            logits = head.logits(feature[0, 0]).float()                  # (draft_vocab,)
            if sampler.greedy:
                choice = logits.argmax()
                rows.append(logits)
            else:
                probs = sampler.probs(logits[None])[0]
                choice = sample_from(probs[None], sampler.generator)[0]
                rows.append(probs)
            token = head.vocab[choice]
            drafted.append(token)
            if step + 1 < k:
                # The next step reads the head's own predicted feature (no target feature exists yet).
                feature, (keys, values) = head(feature, token.view(1, 1), start=position, cache=(keys, values))
                position += 1
        stacked = torch.stack(rows)
        probs = torch.softmax(stacked, dim=-1) if sampler.greedy else stacked
        full = torch.zeros(k, self._target_vocab, device=device)
        full[:, head.vocab] = probs
        return Draft(torch.stack(drafted), full)


class HeadTreeDrafter(Drafter):
    """A trained head drafting EAGLE-2 trees (core.draft_trees explains the tree): depth by depth it
    expands the `branch` most probable nodes into their `branch` most probable children, in one head
    forward per depth (each node reads its parent's predicted feature and its own token, and sees the
    prefix and its ancestors); the `budget` most probable nodes form the tree. Children are chosen
    deterministically, so verification treats them as one-hot candidates and stays exact. One request
    at a time (trees are a single request's extension)."""

    def __init__(self, base: HeadDrafter, branch: int = 2, budget: int = 16):
        if branch < 1 or budget < 1:
            raise ValueError(f"a draft tree needs branch >= 1 and budget >= 1, got {branch} and {budget}")
        self.base, self.branch, self.budget = base, branch, budget
        self.name = f"{base.name} (tree: top-{branch}, {budget} nodes)"
        self.parameters = base.parameters
        self.hidden_layers = base.hidden_layers

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.base.begin(prompt_ids)

    def observe(self, hidden: Sequence[torch.Tensor]) -> None:
        self.base.observe(hidden)

    def rollback(self, valid_length: int) -> None:
        self.base.rollback(valid_length)

    @torch.inference_mode()
    def propose(self, sequence: torch.Tensor, k: int, sampler: Sampler) -> Draft:
        tokens = sequence[0].tolist()
        primed = self.base.prime(self.base.states[0], tokens) if k > 0 else None
        if primed is None:
            return no_draft()
        head = self.base.head
        device = head.fc.weight.device
        root_feature, keys, values = primed
        prefix, length = keys.shape[2], len(tokens)       # the head's positions from true features: length - 1
        ids, parents, depth, score, prob = [], [], [], [], []
        predicted: dict[int, torch.Tensor] = {}           # node -> its predicted feature (H,)
        slot: dict[int, int] = {}                         # node -> its place in the head's keys and values

        def grow(parent: int, feature: torch.Tensor) -> None:
            dist = sampler.probs(head.logits(feature)[None])[0]
            top = torch.topk(dist, min(self.branch, dist.numel()))
            for p, index in zip(top.values.tolist(), top.indices.tolist()):
                if p <= 0.0:
                    continue
                ids.append(int(head.vocab[index]))
                parents.append(parent)
                depth.append(1 if parent < 0 else depth[parent] + 1)
                score.append((0.0 if parent < 0 else score[parent]) + math.log(p))
                prob.append(p)

        grow(-1, root_feature[0, 0])
        for level in range(1, k):
            frontier = [i for i in range(len(ids)) if depth[i] == level]
            expand = sorted(frontier, key=lambda i: -score[i])[:self.branch]
            if not expand:
                break
            start = keys.shape[2]
            seen = trees.expansion_mask(expand, parents, slot, prefix, start, device)
            features = torch.stack([root_feature[0, 0] if parents[i] < 0 else predicted[parents[i]] for i in expand])
            out, (keys, values) = head(features[None], torch.tensor([[ids[i] for i in expand]], device=device),
                                       cache=(keys, values), mask=seen,
                                       positions=torch.tensor([length - 2 + depth[i] for i in expand], device=device))
            for row, node in enumerate(expand):
                slot[node], predicted[node] = start + row, out[0, row]
                grow(node, out[0, row])

        # The `budget` most probable nodes; a parent's score is at least its child's and ties go to
        # the shallower, so every chosen node's parent is chosen too. Parents come before children.
        chosen = sorted(range(len(ids)), key=lambda i: (-score[i], depth[i], i))[:self.budget]
        chosen.sort(key=lambda i: (depth[i], -score[i], i))
        new = {old: n for n, old in enumerate(chosen)}
        return Draft(torch.tensor([ids[i] for i in chosen], dtype=torch.long, device=sequence.device), None,
                     [-1 if parents[i] < 0 else new[parents[i]] for i in chosen],
                     node_probs=[prob[i] for i in chosen])
