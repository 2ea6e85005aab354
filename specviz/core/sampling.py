"""Pure tensor functions: warped probabilities, sampling, and the verification rules.

Two sampling algorithms, chosen per run (`Sampler.rule`):

- Drafter-invariant sampling (INVARIANT; Daliri, Musco and Suresh 2024, "Coupling without
  Communication and Drafter-Invariant Speculative Decoding"): the token at sequence position t is
  the Gumbel-max (exponential race) of the target's distribution there under noise that depends on
  the seed and t alone (`Sampler.noise`): argmax(target / E_t), E_t ~ Exp(1)^V. A model drafter
  draws with the same E_t, a drafted token is accepted iff it equals that token, and the target's
  token at the first mismatch (or the bonus position) is the correction: no residual. The output is
  then exactly what plain sampling writes with that seed (core.plain draws the same way), whatever
  the drafter, the draft lengths or the tree. It accepts at least (1 - TV) / (1 + TV) of a model's
  drafts where the classic rule accepts 1 - TV; one-hot drafts (prompt lookup) lose nothing.
- Classic speculative sampling (CLASSIC), below.

Classic speculative sampling follows Leviathan et al. 2023 (Algorithm 1) and Chen et al. 2023. Leviathan et
al. call the target distribution p and the draft distribution q; Chen et al. use the opposite
letters (q the target, p the draft). Here they are `target_probs` and `draft_probs`. A drafted token
x is accepted with probability min(1, target(x) / draft(x)); at the first rejection a replacement is
drawn from the normalised residual max(0, target - draft); when every drafted token is accepted, one
bonus token is drawn from the target. The emitted sequence is then distributed exactly as the
target's (warped) distribution. Its randomness is keyed by position too (the uniform of the test at
position t, the draft's draw there, the correction's race there), so a seeded run repeats whenever its
draft lengths repeat; but which draws a position consults depends on where the cycles fell, so its
text can change with the draft lengths (a cost-aware policy chooses them from measured times).

A batch of chains is verified at once (`verify_chains`): acceptance, the correction and everything
the views show cross from the device to the host in one copy per pass. Token trees (core.trees)
verify with the same pieces, one tree at a time.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from .sampling_rules import CLASSIC, INVARIANT, SAMPLING_RULES  # noqa: F401 - CLASSIC: re-exported


def validate_sampling(temperature: float, top_k: int, top_p: float) -> None:
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0 (0 means greedy), got {temperature}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0 disables it), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")


# The streams of position-keyed randomness: the token race (the target's, and an invariant draft's),
# a classic draft's own race, and the classic test's uniforms.
TOKEN, DRAFT, UNIFORM = "token", "draft", "uniform"
_NOISE_KEPT = 32            # noise rows a sampler keeps (a draft's and its verification's share them)


def keyed_seed(seed: int, stream: str, key) -> int:
    """A 63-bit seed for the draws of `stream` at `key` (a position) of a run seeded with `seed`."""
    digest = hashlib.blake2b(f"{seed}:{stream}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


class Sampler:
    """Temperature, top-k and top-p exactly as transformers' logits warpers apply them (same
    classes, same order), and randomness that never touches global RNG: noise and uniforms keyed
    by (seed, position) (`noise`, `uniforms`), and a private `torch.Generator` for unkeyed draws.
    `rule`: INVARIANT or CLASSIC speculative sampling (module docstring); greedy ignores it."""

    def __init__(self, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
                 seed: int | None = None, device: torch.device | str = "cpu", rule: str = INVARIANT):
        validate_sampling(temperature, top_k, top_p)
        if rule not in SAMPLING_RULES:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLING_RULES)}, got {rule!r}")
        self.temperature, self.top_k, self.top_p, self.rule = temperature, top_k, top_p, rule
        self.greedy = temperature == 0.0
        self.invariant = not self.greedy and rule == INVARIANT
        self.warpers = []
        if not self.greedy:
            if temperature != 1.0:
                self.warpers.append(TemperatureLogitsWarper(temperature))
            if top_k:
                self.warpers.append(TopKLogitsWarper(top_k))
            if top_p < 1.0:
                self.warpers.append(TopPLogitsWarper(top_p))
        # Unseeded: a fresh seed, so that the keyed draws still differ run to run.
        self.seed = secrets.randbits(63) if seed is None else seed
        self.generator = torch.Generator(device=device).manual_seed(self.seed)
        self._keyed = torch.Generator(device=device)
        self._noise: dict[tuple, torch.Tensor] = {}

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """(n, V) logits -> (n, V) float32 probabilities of the warped distribution.
        Greedy runs report the plain softmax (temperature 1) so that probabilities stay informative."""
        scores = logits.float()
        for warper in self.warpers:
            scores = warper(None, scores)
        return torch.softmax(scores, dim=-1)

    # ------------------------------------------------------------------ position-keyed randomness

    def noise(self, position, vocab: int, device: torch.device, stream: str = TOKEN) -> torch.Tensor:
        """(vocab,) Exp(1) noise of `stream` at `position`: the same for every caller (drafter,
        verification, plain decoding) and every run with this seed. The token there is
        argmax(probs / noise). (-log of uniforms: an exponential race as `sample_from` runs, at a
        seventh of `exponential_`'s cost on a CPU.)"""
        key = (stream, position, vocab, str(device))
        kept = self._noise.get(key)
        if kept is None:
            self._keyed.manual_seed(keyed_seed(self.seed, stream, position))
            kept = torch.rand(vocab, generator=self._keyed, device=self._keyed.device).to(device).log_().neg_()
            if len(self._noise) >= _NOISE_KEPT:
                self._noise.pop(next(iter(self._noise)))        # the oldest: positions only move on
            self._noise[key] = kept
        return kept

    def noise_rows(self, positions: Sequence, vocab: int, device: torch.device, stream: str = TOKEN) -> torch.Tensor:
        """(len(positions), vocab): `noise` at each position."""
        if not positions:
            return torch.ones(0, vocab, device=device)
        return torch.stack([self.noise(p, vocab, device, stream) for p in positions])

    def race(self, probs: torch.Tensor, positions: Sequence, stream: str = TOKEN) -> torch.Tensor:
        """(n, V) probabilities -> (n,) tokens, row i the exponential race under the noise at
        positions[i]; argmax when greedy."""
        if self.greedy:
            return probs.argmax(dim=-1)
        return (probs / self.noise_rows(positions, probs.shape[-1], probs.device, stream)).argmax(dim=-1)

    @property
    def draft_stream(self) -> str:
        """The noise a model drafter draws with: invariant, the target's own (so a draft equal to the
        target draws the target's tokens); classic, a stream of its own."""
        return TOKEN if self.invariant else DRAFT

    def draft(self, probs: torch.Tensor, positions: Sequence) -> torch.Tensor:
        """A model drafter's tokens at `positions` from its (n, V) distributions (`draft_stream`)."""
        return self.race(probs, positions, self.draft_stream)

    def uniforms(self, positions: Sequence) -> list[float]:
        """U[0, 1) at each position (the classic test's), straight from the keyed seed: no generator."""
        return [(keyed_seed(self.seed, UNIFORM, p) >> 10) / 2.0 ** 53 for p in positions]


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
                  uniforms: torch.Tensor | None = None, noise: torch.Tensor | None = None) -> list[Verification]:
    """Verify B drafted chains at once, on the device, with one copy to the host (vLLM's shape: a
    whole batch per call, one placeholder-padded buffer read at the end).

    target_logits: (B, n + 1, V) the target's logits at each drafted position plus the bonus one;
                   row r's drafted tokens are scored by its first lengths[r] + 1 positions.
    drafted:       (B, n) drafted ids, row r's first lengths[r] valid (the rest any id).
    draft_probs:   (B, n, V) the draft distribution each token was drawn from, or None for one-hot
                   drafts (prompt lookup), whose draft probability of its own token is 1.
    samplers:      one per row; greedy, invariant or classic as the first is (a batch shares one
                   sampling rule, each row has its own seed).
    uniforms:      (B, n) U[0, 1) draws, row r's first lengths[r] its own (classic only; see `position_draws`).
    noise:         (B, n + 1, V) Exp(1) token noise at each row's positions (sampling; see
                   `position_draws`). Classic without it draws its correction from the row's generator.

    Greedy: accept the longest prefix that matches the target's argmax; the correction (or bonus)
    is the argmax at the first mismatch. Invariant: the same with the target's token at each position
    its race under `noise` (argmax(target / noise)). Classic: accept drafted token x with probability
    min(1, target(x) / draft(x)); at the first rejection draw from the normalised residual
    max(0, target - draft), after a fully accepted chain from the target at the bonus position."""
    batch, n = drafted.shape
    device = drafted.device
    # Chains of the full width (a single request, a draft model's batch) need no copy of their lengths.
    count = (torch.full((batch,), n, device=device) if all(size == n for size in lengths)
             else torch.tensor(lengths, device=device))
    valid = torch.arange(n, device=device)[None] < count[:, None]                  # (B, n)
    ids = torch.where(valid, drafted, torch.zeros_like(drafted))
    greedy, invariant = samplers[0].greedy, samplers[0].invariant
    if greedy:
        scores = target_logits.float()
        # max(dim) returns the first index of a tie, as argmax (and `generate`) do; its value also
        # steadies the softmax normaliser, so the two share one pass over the vocabulary.
        top_logit, top = scores.max(dim=-1)                                         # (B, n + 1)
        total = (scores - top_logit[..., None]).exp_().sum(dim=-1)                  # normaliser / e^max
        target_p = (scores[:, :n].gather(2, ids[..., None])[..., 0] - top_logit[:, :n]).exp() / total[:, :n]
    else:
        probs = samplers[0].probs(target_logits.reshape(-1, target_logits.shape[-1])).reshape(target_logits.shape)
        target_p = probs[:, :n].gather(2, ids[..., None])[..., 0]
        if invariant:
            # The target's token at each position: its race under that position's noise.
            top = (probs / noise).argmax(dim=-1)                                     # (B, n + 1)
    draft_p = (torch.ones_like(target_p) if draft_probs is None
               else draft_probs.gather(2, ids[..., None])[..., 0].float())
    if greedy or invariant:
        # Accept drafted token i iff it is the target's own token there (argmax, or the race's winner).
        accept = (top[:, :n] == ids) & valid
    else:
        # Accept drafted token i with probability min(1, target(x_i) / draft(x_i)).
        accept = (uniforms * draft_p < target_p) & valid
    accepted = accept.long().cumprod(dim=1).sum(dim=1)                              # (B,)

    dist = None
    if greedy:
        correction = top.gather(1, accepted[:, None])[:, 0]
        correction_prob = total.gather(1, accepted[:, None])[:, 0].reciprocal()
    elif invariant:     # no residual: the target's own token where the draft parted from it
        correction = top.gather(1, accepted[:, None])[:, 0]
        correction_prob = probs[torch.arange(batch, device=device), accepted, correction]
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
        if noise is not None:   # the correction's race under the noise of its position
            correction = (dist / noise.gather(1, accepted[:, None, None].expand(batch, 1, vocab))[:, 0]).argmax(dim=-1)
        else:
            correction = torch.cat([sample_from(dist[row:row + 1], sampler.generator)
                                    for row, sampler in enumerate(samplers)])
        correction_prob = dist.gather(1, correction[:, None])[:, 0]

    # One copy to the host: per row [accepted, correction, its probability, n drafted ids, n target
    # probabilities, n draft ones, then n uniforms (classic) or n + 1 target tokens (greedy, invariant)].
    tops = greedy or invariant
    last = top if tops else uniforms
    host = torch.cat([accepted[:, None].double(), correction[:, None].double(), correction_prob[:, None].double(),
                      ids.double(), target_p.double(), draft_p.double(), last.double()], dim=1).tolist()
    out = []
    for row, values in enumerate(host):
        size, num = lengths[row], int(values[0])
        drafts, targets, draws, tail = (values[3:3 + n], values[3 + n:3 + 2 * n], values[3 + 2 * n:3 + 3 * n],
                                        values[3 + 3 * n:])
        out.append(Verification(
            num_accepted=num, correction=int(values[1]), correction_prob=values[2],
            uniforms=[] if tops else tail[:min(num + 1, size)],
            residual=None if tops or num == size else dist[row],
            target_top=[int(t) for t in tail[:num + 1]] if tops else [],
            target_probs=targets[:size], draft_probs=draws[:size], drafted=[int(t) for t in drafts[:size]]))
    return out


def position_draws(samplers: list[Sampler], starts: list[int], lengths: list[int], width: int, vocab: int,
                   device: torch.device) -> tuple[torch.Tensor | None, torch.Tensor]:
    """What `verify_chains` draws for sampled chains, keyed by position: (uniforms (B, width), noise
    (B, width + 1, V)). Row r's drafted token i sits at position starts[r] + i: its uniform (classic
    only, else None) and the noise of positions starts[r] .. + lengths[r] (the rest 1.0, never consulted)."""
    uniforms = None
    if not samplers[0].invariant:
        uniforms = torch.tensor([sampler.uniforms(range(start, start + size)) + [1.0] * (width - size)
                                 for sampler, start, size in zip(samplers, starts, lengths)], device=device)
    noise = torch.ones(len(samplers), width + 1, vocab, device=device)
    for row, (sampler, start, size) in enumerate(zip(samplers, starts, lengths)):
        noise[row, :size + 1] = sampler.noise_rows(range(start, start + size + 1), vocab, device)
    return uniforms, noise


def verify_greedy(target_logits: torch.Tensor, drafted: torch.Tensor,
                  draft_probs: torch.Tensor | None = None) -> Verification:
    """`verify_chains` for one chain: `target_logits` (n + 1, V), `drafted` (n,)."""
    return verify_chains(target_logits[None], drafted[None], [drafted.shape[0]],
                         None if draft_probs is None else draft_probs[None], [Sampler()])[0]


class _Given(Sampler):
    """A greedy-free sampler that draws with a given generator (the single-chain wrapper's)."""

    def __init__(self, generator: torch.Generator, invariant: bool = False):
        self.greedy, self.invariant, self.warpers, self.generator = False, invariant, [], generator

    def probs(self, probs: torch.Tensor) -> torch.Tensor:   # already probabilities
        return probs


def verify_sampled(target_probs: torch.Tensor, draft_probs: torch.Tensor | None, drafted: torch.Tensor,
                   uniforms: torch.Tensor, generator: torch.Generator) -> Verification:
    """`verify_chains` for one chain, given its warped target distributions `target_probs` (n + 1,
    V), its draft's `draft_probs` (n, V) or None (one-hot), and its n uniforms."""
    return verify_chains(target_probs[None], drafted[None], [drafted.shape[0]],
                         None if draft_probs is None else draft_probs[None], [_Given(generator)], uniforms[None])[0]


def verify_invariant(target_probs: torch.Tensor, drafted: torch.Tensor, noise: torch.Tensor) -> Verification:
    """`verify_chains` for one chain under drafter-invariant sampling, given its warped target
    distributions `target_probs` (n + 1, V) and the token noise `noise` (n + 1, V) of its positions."""
    return verify_chains(target_probs[None], drafted[None], [drafted.shape[0]], None,
                         [_Given(torch.Generator(), invariant=True)], noise=noise[None])[0]


def top_tokens(probs: torch.Tensor, n: int = 10) -> list[tuple[int, float]]:
    """The n most probable tokens of `probs` (V,) with their probabilities (those above 0), in one copy."""
    values, indices = probs.topk(min(n, probs.shape[-1]))
    ids, values = to_host(indices, values)
    return [(int(i), v) for i, v in zip(ids, values) if v > 0]
