"""Pure tensor functions: warped probabilities, sampling, and the two verification rules.

Speculative sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023. Leviathan et
al. call the target distribution p and the draft distribution q; Chen et al. use the opposite
letters (q the target, p the draft). Here they are `target_probs` and `draft_probs`. A drafted token
x is accepted with probability min(1, target(x) / draft(x)); at the first rejection a replacement is
drawn from the normalised residual max(0, target - draft); when every drafted token is accepted, one
bonus token is drawn from the target. The emitted sequence is then distributed exactly as the
target's (warped) distribution.

A batch of chains is verified at once (`verify_chains`): acceptance, the correction and everything
the views show cross from the device to the host in one copy per pass. Token trees (core.trees)
verify with the same pieces, one tree at a time.
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
    drafted: list[int] = field(default_factory=list)         # the drafted ids, as verified (chains)


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


def verify_chains(target_logits: torch.Tensor, drafted: torch.Tensor, lengths: list[int],
                  draft_probs: torch.Tensor | None, samplers: list[Sampler],
                  uniforms: torch.Tensor | None = None) -> list[Verification]:
    """Verify B drafted chains at once, on the device, with one copy to the host (vLLM's shape: a
    whole batch per call, one placeholder-padded buffer read at the end).

    target_logits: (B, n + 1, V) the target's logits at each drafted position plus the bonus one;
                   row r's drafted tokens are scored by its first lengths[r] + 1 positions.
    drafted:       (B, n) drafted ids, row r's first lengths[r] valid (the rest any id).
    draft_probs:   (B, n, V) the draft distribution each token was drawn from, or None for one-hot
                   drafts (prompt lookup), whose draft probability of its own token is 1.
    samplers:      one per row; greedy when the first is (a batch shares one sampling rule, each row
                   has its own generator).
    uniforms:      (B, n) U[0, 1) draws, row r's first lengths[r] drawn from its own generator
                   (sampling only; see `draw_uniforms`).

    Greedy: accept the longest prefix that matches the target's argmax; the correction (or bonus)
    is the argmax at the first mismatch. Sampling: accept drafted token x with probability
    min(1, target(x) / draft(x)); at the first rejection draw from the normalised residual
    max(0, target - draft), after a fully accepted chain from the target at the bonus position."""
    batch, n = drafted.shape
    device = drafted.device
    # Chains of the full width (a single request, a draft model's batch) need no copy of their lengths.
    count = (torch.full((batch,), n, device=device) if all(size == n for size in lengths)
             else torch.tensor(lengths, device=device))
    valid = torch.arange(n, device=device)[None] < count[:, None]                  # (B, n)
    ids = torch.where(valid, drafted, torch.zeros_like(drafted))
    greedy = samplers[0].greedy
    if greedy:
        scores = target_logits.float()
        # max(dim) returns the first index of a tie, as argmax (and `generate`) do; its value also
        # steadies the softmax normaliser, so the two share one pass over the vocabulary.
        top_logit, top = scores.max(dim=-1)                                         # (B, n + 1)
        total = (scores - top_logit[..., None]).exp_().sum(dim=-1)                  # normaliser / e^max
        target_p = (scores[:, :n].gather(2, ids[..., None])[..., 0] - top_logit[:, :n]).exp() / total[:, :n]
        accept = (top[:, :n] == ids) & valid
    else:
        probs = samplers[0].probs(target_logits.reshape(-1, target_logits.shape[-1])).reshape(target_logits.shape)
        target_p = probs[:, :n].gather(2, ids[..., None])[..., 0]
    draft_p = (torch.ones_like(target_p) if draft_probs is None
               else draft_probs.gather(2, ids[..., None])[..., 0].float())
    if not greedy:
        # Accept drafted token i with probability min(1, target(x_i) / draft(x_i)).
        accept = (uniforms * draft_p < target_p) & valid
    accepted = accept.long().cumprod(dim=1).sum(dim=1)                              # (B,)

    if greedy:
        correction = top.gather(1, accepted[:, None])[:, 0]
        correction_prob = total.gather(1, accepted[:, None])[:, 0].reciprocal()
        dist = None
    else:
        vocab = probs.shape[-1]
        at = probs.gather(1, accepted[:, None, None].expand(batch, 1, vocab))[:, 0]   # (B, V)
        dist = at
        if n:
            rejected = accepted < count
            where = accepted.clamp(max=n - 1)
            if draft_probs is None:     # a one-hot draft: the target just loses the rejected token
                left = at.scatter(1, ids.gather(1, where[:, None]), 0.0)
            else:
                left = (at - draft_probs.gather(1, where[:, None, None].expand(batch, 1, vocab))[:, 0]).clamp_(min=0.0)
            left_total = left.sum(dim=-1, keepdim=True)
            # Not in Algorithm 1: a rejection implies draft(x) > target(x), so the residual has mass; the
            # guard only covers float round-off when the two distributions are equal.
            left = torch.where(left_total > 0, left / left_total.clamp(min=torch.finfo(left.dtype).tiny), at)
            dist = torch.where(rejected[:, None], left, at)
        correction = torch.cat([sample_from(dist[row:row + 1], sampler.generator)
                                for row, sampler in enumerate(samplers)])
        correction_prob = dist.gather(1, correction[:, None])[:, 0]

    # One copy to the host: per row [accepted, correction, its probability, n drafted ids, n target
    # probabilities, n draft ones, then n uniforms (sampling) or n + 1 argmaxes (greedy)].
    last = uniforms if not greedy else top
    host = torch.cat([accepted[:, None].double(), correction[:, None].double(), correction_prob[:, None].double(),
                      ids.double(), target_p.double(), draft_p.double(), last.double()], dim=1).tolist()
    out = []
    for row, values in enumerate(host):
        size, num = lengths[row], int(values[0])
        drafts, targets, draws, tail = (values[3:3 + n], values[3 + n:3 + 2 * n], values[3 + 2 * n:3 + 3 * n],
                                        values[3 + 3 * n:])
        out.append(Verification(
            num_accepted=num, correction=int(values[1]), correction_prob=values[2],
            uniforms=[] if greedy else tail[:min(num + 1, size)],
            residual=None if greedy or num == size else dist[row],
            target_top=[int(t) for t in tail[:num + 1]] if greedy else [],
            target_probs=targets[:size], draft_probs=draws[:size], drafted=[int(t) for t in drafts[:size]]))
    return out


def draw_uniforms(samplers: list[Sampler], lengths: list[int], width: int, device: torch.device) -> torch.Tensor:
    """(B, width) U[0, 1) draws for `verify_chains`: row r's first lengths[r] from its own generator
    (so a row draws exactly what it would draw alone), the rest 1.0 (never consulted)."""
    rows = [torch.cat([sampler.uniform(size, device), torch.ones(width - size, device=device)])
            for sampler, size in zip(samplers, lengths)]
    return torch.stack(rows) if rows else torch.ones(0, width, device=device)


def verify_greedy(target_logits: torch.Tensor, drafted: torch.Tensor,
                  draft_probs: torch.Tensor | None = None) -> Verification:
    """`verify_chains` for one chain: `target_logits` (n + 1, V), `drafted` (n,)."""
    return verify_chains(target_logits[None], drafted[None], [drafted.shape[0]],
                         None if draft_probs is None else draft_probs[None], [Sampler()])[0]


class _Given(Sampler):
    """A greedy-free sampler that draws with a given generator (the single-chain wrapper's)."""

    def __init__(self, generator: torch.Generator):
        self.greedy, self.warpers, self.generator = False, [], generator

    def probs(self, probs: torch.Tensor) -> torch.Tensor:   # already probabilities
        return probs


def verify_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, drafted: torch.Tensor,
                   uniforms: torch.Tensor, generator: torch.Generator) -> Verification:
    """`verify_chains` for one chain, given its warped target distributions `target_probs` (n + 1,
    V), its draft's `draft_probs` (n, V) or None (one-hot), and its n uniforms."""
    return verify_chains(target_probs[None], drafted[None], [drafted.shape[0]],
                         None if draft_probs is None else draft_probs[None], [_Given(generator)], uniforms[None])[0]


def top_tokens(probs: torch.Tensor, n: int = 10) -> list[tuple[int, float]]:
    """The n most probable tokens of `probs` (V,) with their probabilities (those above 0), in one copy."""
    values, indices = probs.topk(min(n, probs.shape[-1]))
    ids, values = to_host(indices, values)
    return [(int(i), v) for i, v in zip(ids, values) if v > 0]
