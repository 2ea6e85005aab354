"""Pure tensor functions: warped probabilities, sampling, and the two verification rules.

Speculative sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023. The papers
call the target distribution p and the draft distribution q; here they are `target_probs` and
`draft_probs`. A drafted token x is accepted with probability min(1, target(x) / draft(x)); at the
first rejection a replacement is drawn from the normalised residual max(0, target - draft); when
every drafted token is accepted, one bonus token is drawn from the target. The emitted sequence is
then distributed exactly as the target's (warped) distribution.
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


def _to_host(*columns: torch.Tensor) -> list[list[float]]:
    # Every number a verification reports crosses to the host in one copy: one device sync per
    # call instead of one per `.tolist()` / `float()`. float64 holds token ids exactly.
    if not columns[0].numel():
        return [[] for _ in columns]
    return torch.stack([c.double() for c in columns]).tolist()


def verify_greedy(target_logits: torch.Tensor, drafted: torch.Tensor,
                  draft_probs: torch.Tensor | None = None) -> Verification:
    """Accept the longest prefix of `drafted` that matches the target's argmax; the correction
    (or bonus) is the target's argmax at the first mismatch. `target_logits` is (n + 1, V).

    Reported probabilities are the plain softmax (temperature 1), computed only where needed:
    at the drafted tokens and at each argmax, from one normaliser per row, never a full (n + 1, V)
    softmax. `draft_probs` (n, V), when given, is read at the drafted tokens in the same copy."""
    n = drafted.shape[0]
    scores = target_logits.float()
    # max(dim) returns the first index of a tie, as argmax (and `generate`) do; its value also
    # steadies the softmax normaliser, so the two share one pass over the vocabulary.
    top_logit, top = scores.max(dim=-1)                                   # (n + 1,)
    total = (scores - top_logit[:, None]).exp_().sum(dim=-1)              # softmax normaliser / e^max
    top_prob = total.reciprocal()
    positions = torch.arange(n, device=scores.device)
    drafted_prob = (scores[positions, drafted] - top_logit[:n]).exp() / total[:n]
    drafted_draft = torch.ones_like(drafted_prob) if draft_probs is None else draft_probs[positions, drafted]
    pad_id, pad_prob = top.new_zeros(1), top_prob.new_zeros(1)   # drafted columns are one shorter
    tops, top_probs, drafted_ids, target_p, draft_p = _to_host(
        top, top_prob, torch.cat([drafted, pad_id]), torch.cat([drafted_prob, pad_prob]),
        torch.cat([drafted_draft.float(), pad_prob]))
    tops = [int(t) for t in tops]
    num_accepted = next((i for i in range(n) if tops[i] != drafted_ids[i]), n)
    return Verification(num_accepted, tops[num_accepted], top_probs[num_accepted], [], None,
                        tops[: num_accepted + 1], target_p[:n], draft_p[:n])


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
    accepted, all_uniforms, target_list, draft_list = _to_host(uniforms * draft_p < target_p, uniforms,
                                                                target_p, draft_p)
    num_accepted = accepted.index(0.0) if 0.0 in accepted else n
    used_uniforms = all_uniforms[: min(num_accepted + 1, n)]

    if num_accepted == n:
        # Every draft accepted: the bonus token comes straight from the target.
        dist, residual = target_probs[n], None
    else:
        # Rejected at position i: draw from the normalised residual max(0, target - draft).
        i = num_accepted
        if draft_probs is None:
            residual = target_probs[i].clone()
            residual[drafted[i]] = 0.0
        else:
            residual = (target_probs[i] - draft_probs[i]).clamp_(min=0.0)
        total = residual.sum()
        # Not in Algorithm 1: a rejection implies draft(x) > target(x), so the residual has mass;
        # the guard only covers float round-off when the two distributions are equal. (torch.where
        # rather than `if total > 0`: no device sync.)
        residual = torch.where(total > 0, residual / total, target_probs[i])
        dist = residual
    token = sample_from(dist[None], generator)
    correction, correction_prob = _to_host(token, dist[token])
    return Verification(num_accepted, int(correction[0]), correction_prob[0], used_uniforms, residual, [],
                        target_list, draft_list)


def top_tokens(probs: torch.Tensor, n: int = 10) -> list[tuple[int, float]]:
    values, indices = probs.topk(min(n, probs.shape[-1]))
    return [(int(i), float(v)) for i, v in zip(indices.tolist(), values.tolist()) if v > 0]
