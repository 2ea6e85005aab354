"""Pure tensor functions: warped probabilities, sampling, and the two verification rules.

Speculative sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023. Leviathan et
al. call the target distribution p and the draft distribution q; Chen et al. use the opposite
letters (q the target, p the draft). Here they are `target_probs` and `draft_probs`. A drafted token
x is accepted with probability min(1, target(x) / draft(x)); at the first rejection a replacement is
drawn from the normalised residual max(0, target - draft); when every drafted token is accepted, one
bonus token is drawn from the target. The emitted sequence is then distributed exactly as the
target's (warped) distribution.

Each verification crosses from the device to the host twice: once for what the acceptance rule
needs, once for the correction. Token trees (core.trees) verify with the same pieces.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


class Sampler:
    """Temperature, top-k and top-p exactly as transformers' logits warpers apply them (same
    classes, same order), plus a private `torch.Generator` so a seed never touches global RNG."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, device: torch.device | str = "cpu"):
        validate_sampling(temperature, top_k, top_p)
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.greedy = temperature == 0.0
        self.warpers = []
        if not self.greedy:
            if temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(temperature))
            if top_k:
                self.warpers.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p))
        self.generator = torch.Generator(device=device)
        if seed is None:
            self.generator.seed()
        else:
            self.generator.manual_seed(seed)

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) logits -> (n, V) float32 probabilities of the warped distribution.
        Greedy runs report the plain softmax (temperature 1) so that probabilities stay informative."""
        scores = logits.float()
        for warper in self.warpers:
            scores = warper(None, scores)
        return torch.softmax(scores, dim=-1)

    def sample(self, probs: torch.Tensor) -> torch.Tensor:
        """(n, V) probabilities -> (n,) tokens; argmax when greedy."""
        if self.greedy:
            return probs.argmax(dim=-1)
        return sample_from(probs, self.generator)

    def uniform(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.rand(n, generator=self.generator, device=device)


def sample_from(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    # Exponential race (Gumbel-max in disguise): argmax(probs / Exp(1)) is a draw from `probs`
    # without torch.multinomial's host-device sync.
    noise = torch.empty_like(probs).exponential_(1, generator=generator)
    return (probs / noise).argmax(dim=-1)


# ----------------------------------------------------------------------------- verification

@dataclass(frozen=True)
class Verification:
    num_accepted: int
    correction: int             # replacement after a rejection, or the bonus token
    correction_prob: float      # its probability in the distribution it was drawn from
    uniforms: list[float]       # draws consulted: one per verified token (sampling only)
    residual: torch.Tensor | None  # normalised residual distribution after a rejection (sampling only)
    target_top: list[int]       # greedy only: target argmax at each verified position
    target_probs: list[float] = field(default_factory=list)  # target probability of each drafted token
    draft_probs: list[float] = field(default_factory=list)   # draft probability of each drafted token


def to_host(*columns: torch.Tensor) -> list[list[float]]:
    """Equal-length columns as host lists, in one copy: one device sync instead of one per
    `.tolist()` / `float()`. float64 holds token ids exactly."""
    if not columns[0].numel():
        return [[] for _ in columns]
    return torch.stack([c.double() for c in columns]).tolist()


GreedyReads = tuple[list[int], list[float], list[int], list[float], list[float]]


def greedy_reads(target_logits: torch.Tensor, rows: torch.Tensor, drafted: torch.Tensor,
                 draft_probs: torch.Tensor | None) -> GreedyReads:
    """What greedy verification reads, in one copy: the argmax and its probability at each of the
    n + 1 rows of `target_logits`, and the ids and the target's and the draft's probabilities of the
    n drafted tokens, drafted[i] being scored by row rows[i] (a chain: row i; a tree: its parent's):
    (argmax per row, its probability, drafted ids, their target probabilities, their draft ones).

    Probabilities are the plain softmax (temperature 1) from one normaliser per row, never a full
    (n + 1, V) softmax. `draft_probs` (n, V), when given, is read at the drafted tokens."""
    n = drafted.shape[0]
    scores = target_logits.float()
    # max(dim) returns the first index of a tie, as argmax (and `generate`) do; its value also
    # steadies the softmax normaliser, so the two share one pass over the vocabulary.
    top_logit, top = scores.max(dim=-1)                                   # (n + 1,)
    total = (scores - top_logit[:, None]).exp_().sum(dim=-1)              # softmax normaliser / e^max
    drafted_prob = (scores[rows, drafted] - top_logit[rows]).exp() / total[rows]
    nodes = torch.arange(n, device=scores.device)
    drafted_draft = torch.ones_like(drafted_prob) if draft_probs is None else draft_probs[nodes, drafted]
    pad_id, pad_prob = top.new_zeros(1), total.new_zeros(1)   # drafted columns are one shorter
    tops, top_probs, ids, target_p, draft_p = to_host(
        top, total.reciprocal(), torch.cat([drafted, pad_id]), torch.cat([drafted_prob, pad_prob]),
        torch.cat([drafted_draft.float(), pad_prob]))
    return [int(t) for t in tops], top_probs, [int(i) for i in ids[:n]], target_p[:n], draft_p[:n]


def residual(dist: torch.Tensor, draft_dist: torch.Tensor | None, token: torch.Tensor,
             fallback: torch.Tensor) -> torch.Tensor:
    """What is left of `dist` after rejecting `token` (a 1-element tensor) drawn from `draft_dist`:
    the normalised max(0, dist - draft_dist); a one-hot draft (None) just loses `token`."""
    if draft_dist is None:
        left = dist.clone().index_fill_(0, token, 0.0)     # index_fill_ takes a tensor index: no sync
    else:
        left = (dist - draft_dist).clamp_(min=0.0)
    total = left.sum()
    # Not in Algorithm 1: a rejection implies draft(x) > target(x), so the residual has mass; the
    # guard only covers float round-off when the two distributions are equal. (torch.where rather
    # than `if total > 0`: no device sync.)
    return torch.where(total > 0, left / total, fallback)


def draw(dist: torch.Tensor, generator: torch.Generator) -> tuple[int, float]:
    """One token from `dist` (V,) and its probability there, in one copy."""
    token = sample_from(dist[None], generator)
    (token_id,), (prob,) = to_host(token, dist[token])
    return int(token_id), prob


def verify_greedy(target_logits: torch.Tensor, drafted: torch.Tensor,
                  draft_probs: torch.Tensor | None = None) -> Verification:
    """Accept the longest prefix of `drafted` that matches the target's argmax; the correction
    (or bonus) is the target's argmax at the first mismatch. `target_logits` is (n + 1, V)."""
    n = drafted.shape[0]
    tops, top_probs, ids, target_p, draft_p = greedy_reads(
        target_logits, torch.arange(n, device=drafted.device), drafted, draft_probs)
    num_accepted = next((i for i in range(n) if tops[i] != ids[i]), n)
    return Verification(num_accepted=num_accepted, correction=tops[num_accepted],
                        correction_prob=top_probs[num_accepted], uniforms=[], residual=None,
                        target_top=tops[: num_accepted + 1], target_probs=target_p, draft_probs=draft_p)


def verify_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, drafted: torch.Tensor,
                   uniforms: torch.Tensor, generator: torch.Generator) -> Verification:
    """Speculative sampling over n drafted tokens.

    target_probs: (n + 1, V) warped target distribution at each drafted position plus the bonus one.
    draft_probs:  (n, V) warped draft distribution, or None for a one-hot drafter (prompt lookup),
                  whose draft probability of its own token is 1.
    uniforms:     (n,) U[0, 1) draws, one per drafted token.
    """
    n = drafted.shape[0]
    positions = torch.arange(n, device=drafted.device)
    target_p = target_probs[positions, drafted]
    draft_p = torch.ones_like(target_p) if draft_probs is None else draft_probs[positions, drafted]
    # Accept drafted token i with probability min(1, target(x_i) / draft(x_i)).
    accepted, all_uniforms, target_list, draft_list = to_host(uniforms * draft_p < target_p, uniforms,
                                                               target_p, draft_p)
    num_accepted = accepted.index(0.0) if 0.0 in accepted else n
    i = num_accepted
    if i == n:
        # Every draft accepted: the bonus token comes straight from the target.
        left = None
    else:
        # Rejected at position i: draw from the normalised residual max(0, target - draft).
        left = residual(target_probs[i], None if draft_probs is None else draft_probs[i], drafted[i:i + 1],
                        target_probs[i])
    correction, correction_prob = draw(target_probs[n] if left is None else left, generator)
    return Verification(num_accepted=num_accepted, correction=correction, correction_prob=correction_prob,
                        uniforms=all_uniforms[: min(num_accepted + 1, n)], residual=left, target_top=[],
                        target_probs=target_list, draft_probs=draft_list)


def top_tokens(probs: torch.Tensor, n: int = 10) -> list[tuple[int, float]]:
    """The n most probable tokens of `probs` (V,) with their probabilities (those above 0), in one copy."""
    values, indices = probs.topk(min(n, probs.shape[-1]))
    ids, values = to_host(indices, values)
    return [(int(i), v) for i, v in zip(ids, values) if v > 0]
