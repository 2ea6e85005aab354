"""Training a draft head (core.head) for a target, from the target itself (self-distillation):

1. The target writes the training text: its own greedy continuations of the prompts, in batches
   (core.plain's batched decoding). Saved as `sequences.json` in the output folder.
2. One target forward per sequence gives, at every position, its last hidden state (the head's
   input) and its argmax (the head's label: what the target would choose there).
3. The draft vocabulary: the most frequent labels (at most `draft_vocab` of them).
4. Training: the head reads (f_i, token i+1) and predicts f_{i+1} (smooth L1) and the target's token at
   i+2 (cross-entropy over the draft vocabulary). A second pass trains the second drafting step: it
   reads its own predicted feature where drafting has no target feature, and sees the earlier
   positions' true ones (`DraftHead.forward(context=...)`). Each epoch ends with the held-out top-1
   agreement with the target (the first step's and the second's), and the head saved: Ctrl-C keeps
   the last finished epoch, and a second run with the same folder resumes from it.

`train_head` yields one `Progress` per report; the command line and the app render them."""

from __future__ import annotations

import json
import math
import random
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from ..core.head import DraftHead, HeadConfig
from ..core.plain import batched_autoregressive_decode
from ..errors import SpecvizError
from ..models import encode_prompt
from ..models.heads import save_head

MIN_TRAINING_TOKENS = 2_000       # below this a head learns nothing worth drafting with
HELD_OUT = 0.1                    # share of sequences kept for measuring agreement
WINDOW = 128                      # training windows (positions) per sequence chunk
FEATURE_BATCH = 8                 # sequences per target forward when collecting features
SEQUENCES, STATE = "sequences.json", "training.pt"


@dataclass(frozen=True)
class TrainOptions:
    tokens: int = 60_000              # generated tokens to train on (the prompts' tokens come on top)
    minutes: float = 20.0             # wall-clock budget, generation and training together
    max_new_tokens: int = 192         # per continuation
    batch: int = 64                   # prompts generated together (measured here: 569 tokens/s at 64, bf16)
    epochs: int = 8
    draft_vocab: int = 8192
    intermediate: int = 1024          # the head's MLP width
    lr: float = 1e-3
    train_batch: int = 8              # windows per optimizer step
    seed: int = 0
    k: int = 2                        # the draft length written as the head's default


@dataclass(frozen=True)
class Progress:
    stage: str                        # "generate", "features", "train", "epoch", "done"
    fraction: float                   # of this stage
    message: str
    epoch: int = 0
    loss: float | None = None
    agreement: float | None = None    # held-out top-1 agreement of the first drafted token
    agreement2: float | None = None   # ... of the second (from the head's own feature)
    baseline: float | None = None     # the most frequent next token (given the current one)
    history: list = field(default_factory=list)   # per finished epoch: (epoch, loss, agreement, agreement2)


# ----------------------------------------------------------------------------- data

def generate_sequences(target, tokenizer, prompts: Sequence[str], options: TrainOptions, eos: Sequence[int],
                       deadline: float, chat: bool = True) -> Iterator[tuple[int, list[list[int]], list[int]]]:
    """Yields (tokens generated so far, sequences, their prompts' lengths) after each batch, until
    `options.tokens` or the deadline."""
    sequences, prompt_lengths, generated = [], [], 0
    encoded = [encode_prompt(tokenizer, p, chat=chat)[0].tolist() for p in prompts]
    for start in range(0, len(encoded), options.batch):
        batch = encoded[start:start + options.batch]
        outputs = [[] for _ in batch]
        for event in batched_autoregressive_decode(target, batch, max_new_tokens=options.max_new_tokens,
                                                   eos_token_id=list(eos)):
            for row, token in zip(event.requests, event.tokens):
                outputs[row].append(token)
            if time.monotonic() > deadline:
                break
        for prompt, output in zip(batch, outputs):
            sequences.append(prompt + output)
            prompt_lengths.append(len(prompt))
            generated += len(output)
        yield generated, sequences, prompt_lengths
        if generated >= options.tokens or time.monotonic() > deadline:
            return


@torch.inference_mode()
def batched_target_features(target, sequences: Sequence[list[int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per sequence, (n, H) the target's last hidden states (after its final norm) and (n,) its argmax at
    each position, from one forward over all: right-padded, so that no real position sees a padding one
    (attention is causal) and each row's features are its own alone."""
    width = max(len(s) for s in sequences)
    ids = torch.zeros(len(sequences), width, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        ids[row, :len(sequence)] = torch.tensor(sequence)
    out = target(ids.to(target.device), output_hidden_states=-1)
    states, labels = out.hidden_states[-1].to("cpu", torch.bfloat16), out.logits.argmax(dim=-1).cpu()
    return [(states[row, :len(s)], labels[row, :len(s)]) for row, s in enumerate(sequences)]


def choose_vocab(labels: Sequence[torch.Tensor], size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The `size` most frequent labels (ties: lower id), the `always` ids (EOS) among them."""
    counts = Counter()
    for block in labels:
        counts.update(block.tolist())
    chosen = list(dict.fromkeys(always))[:size]
    for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0])):
        if len(chosen) >= size:
            break
        if token not in chosen:
            chosen.append(token)
    return torch.tensor(sorted(chosen), dtype=torch.long)


def bigram_baseline(train_tokens, train_labels, test_tokens, test_labels, train_starts=None,
                    test_starts=None) -> tuple[float, float]:
    """Held-out agreement of two baselines: always the most frequent label; the most frequent label
    after the current token (a drafter that knows only the last token). Scored where the head is
    (`_windows`): the labels from each sequence's `starts` entry (its prompt's length) on."""
    counts, after = Counter(), {}
    for tokens, labels, start in zip(train_tokens, train_labels, train_starts or [1] * len(train_tokens)):
        start = max(start, 1)
        for token, label in zip(tokens[start:].tolist(), labels[start:].tolist()):
            counts[label] += 1
            after.setdefault(token, Counter())[label] += 1
    top = counts.most_common(1)[0][0]
    best = {token: c.most_common(1)[0][0] for token, c in after.items()}
    hits_top = hits_after = total = 0
    for tokens, labels, start in zip(test_tokens, test_labels, test_starts or [1] * len(test_tokens)):
        start = max(start, 1)
        for token, label in zip(tokens[start:].tolist(), labels[start:].tolist()):
            hits_top += label == top
            hits_after += best.get(token, top) == label
            total += 1
    return hits_top / max(total, 1), hits_after / max(total, 1)


def _windows(tokens: torch.Tensor, features: torch.Tensor, labels: torch.Tensor, prompt_length: int = 0
             ) -> list[tuple]:
    """A sequence of n tokens as training examples, cut into windows: position i reads (f_i, token
    i+1) and is scored against f_{i+1} and label i+1 (the target's token at i+2), i = 0..n-2. Only
    labels of the response count (label i+1 with i+1 >= the prompt's length: the tokens a head
    drafts; the prompt's positions are still read, as the head's context): a fixed chat template
    and system prompt are easy to learn and would inflate the agreement."""
    n = tokens.shape[0]
    out = []
    for start in range(0, n - 1, WINDOW):
        end = min(start + WINDOW, n - 1)
        response = torch.arange(start + 1, end + 1) >= prompt_length
        out.append((start, features[start:end], tokens[start + 1:end + 1], features[start + 1:end + 1],
                    labels[start + 1:end + 1], response))
    return out


def _batch(windows: list[tuple], index: torch.Tensor, device, dtype):
    length = max(w[1].shape[0] for w in windows)

    def pad(tensors, value=0):
        return torch.stack([F.pad(t, (0, 0, 0, length - t.shape[0]) if t.dim() == 2 else (0, length - t.shape[0]),
                                  value=value) for t in tensors]).to(device)

    features = pad([w[1] for w in windows]).to(dtype)
    tokens = pad([w[2] for w in windows])
    next_features = pad([w[3] for w in windows]).to(dtype)
    # Out of the draft vocabulary or in the prompt: not trained on (a miss when scored).
    labels = pad([torch.where(w[5], index[w[4]], -100) for w in windows], value=-100)
    mask = pad([torch.ones(w[1].shape[0]) for w in windows]).bool()
    scored = pad([w[5] for w in windows], value=False)
    return features, tokens, next_features, labels, mask, scored


def head_losses(head: DraftHead, batch, two_steps: bool = True):
    """(loss, first-step hits, second-step hits, scored positions, second-step scored positions)."""
    features, tokens, next_features, labels, mask, response = batch
    out, context = head(features, tokens)
    logits = head.logits(out).float()
    loss = _cross_entropy(logits, labels)
    loss = loss + 0.2 * F.smooth_l1_loss(out[mask].float(), next_features[mask].float())
    hits = ((logits.argmax(-1) == labels) & (labels >= 0)).sum()
    scored = response.sum()
    hits2 = scored2 = torch.zeros((), dtype=torch.long)
    if two_steps and features.shape[1] > 1:
        # The second drafting step at position j reads the first step's prediction of f_j.
        predicted = torch.cat([features[:, :1], out[:, :-1]], dim=1)
        out2, _ = head(predicted, tokens, context=context)
        logits2 = head.logits(out2[:, 1:]).float()
        labels2 = labels[:, 1:]
        loss = loss + 0.6 * _cross_entropy(logits2, labels2)
        hits2 = ((logits2.argmax(-1) == labels2) & (labels2 >= 0)).sum()
        scored2 = response[:, 1:].sum()
    return loss, hits, hits2, scored, scored2


def _cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean over the labelled positions; zero (not NaN) for a window of prompt positions only."""
    if not bool((labels >= 0).any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


# ----------------------------------------------------------------------------- the whole run

def train_head(target, tokenizer, prompts: Sequence[str], out: Path | str, *, target_name: str,
               eos: Sequence[int] = (), options: TrainOptions = TrainOptions(), chat: bool = True
               ) -> Iterator[Progress]:
    """Generate, collect features, train, save after each epoch (module docstring). Resumes from `out`."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    deadline = started + options.minutes * 60
    device = target.device
    torch.manual_seed(options.seed)

    # 1. The target's own text (reused when the folder already holds it).
    path = out / SEQUENCES
    if path.is_file():
        saved = json.loads(path.read_text())
        sequences = saved["sequences"]
        prompt_lengths = saved.get("prompt_lengths") or [0] * len(sequences)   # older files: score every label
        yield Progress("generate", 1.0, f"reusing {len(sequences)} sequences from {path}")
    else:
        if not prompts:
            raise SpecvizError("No training prompts: give a prompt set or a file with at least one prompt.")
        sequences, prompt_lengths = [], []
        order = list(prompts)
        random.Random(options.seed).shuffle(order)
        generation_deadline = started + options.minutes * 60 * 0.5   # half of the budget at most
        for report in generate_sequences(target, tokenizer, order, options, eos, generation_deadline, chat):
            generated, sequences, prompt_lengths = report
            elapsed = time.monotonic() - started
            yield Progress("generate", min(1.0, generated / options.tokens),
                           f"{generated} tokens generated from {len(sequences)} prompts "
                           f"({generated / max(elapsed, 1e-9):.0f} tokens/s)")
        path.write_text(json.dumps({"sequences": sequences, "prompt_lengths": prompt_lengths}))
    total = sum(len(s) for s in sequences)
    if total < MIN_TRAINING_TOKENS or len(sequences) < 2:
        short = max(0, MIN_TRAINING_TOKENS - total)
        raise SpecvizError(f"Training data too small: {total} tokens in {len(sequences)} sequences; a head needs "
                           f"at least {MIN_TRAINING_TOKENS} tokens in 2 sequences ({short} more tokens): give more "
                           "prompts, more --tokens or more --minutes.")

    # 2. Features and labels, one target forward per few sequences.
    tokens, features, labels = [], [], []
    for i in range(0, len(sequences), FEATURE_BATCH):
        for sequence, (f, lab) in zip(sequences[i:i + FEATURE_BATCH],
                                      batched_target_features(target, sequences[i:i + FEATURE_BATCH])):
            tokens.append(torch.tensor(sequence)), features.append(f), labels.append(lab)
        if i % (4 * FEATURE_BATCH) == 0 or len(tokens) == len(sequences):
            yield Progress("features", len(tokens) / len(sequences),
                           f"target features of {len(tokens)}/{len(sequences)} sequences")
    held = max(1, int(len(sequences) * HELD_OUT))
    train_part, test_part = slice(held, None), slice(0, held)

    # 3. The draft vocabulary and the head.
    vocab_size = target.config.get_text_config().vocab_size
    responses = [lab[length:] for lab, length in zip(labels[train_part], prompt_lengths[train_part])]
    vocab = choose_vocab(responses, options.draft_vocab, always=list(eos))
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[vocab] = torch.arange(vocab.numel())
    config = target.config.get_text_config()
    head_config = HeadConfig(hidden_size=config.hidden_size, num_heads=config.num_attention_heads,
                             intermediate_size=options.intermediate, target_vocab_size=vocab_size,
                             target_layers=config.num_hidden_layers, draft_vocab_size=vocab.numel(),
                             rms_norm_eps=getattr(config, "rms_norm_eps", 1e-5),
                             rope_theta=float(getattr(config, "rope_theta", None) or 10000.0))
    head = DraftHead(head_config)
    head.vocab.copy_(vocab)
    head = head.to(device=device, dtype=torch.float32).bind(target)
    head.lm_rows = head.lm_rows.float()
    optimizer = torch.optim.AdamW(head.parameters(), lr=options.lr, weight_decay=0.0)
    history, first_epoch = [], 0
    state_path = out / STATE
    if state_path.is_file():
        saved = torch.load(state_path, weights_only=False)
        if saved["vocab"].tolist() == vocab.tolist() and saved["config"] == head_config.to_dict():
            head.load_state_dict(saved["head"])
            optimizer.load_state_dict(saved["optimizer"])
            history, first_epoch = saved["history"], saved["epoch"]
            yield Progress("train", 0.0, f"resuming after epoch {first_epoch}", epoch=first_epoch, history=history)

    train_windows = [w for part in zip(tokens[train_part], features[train_part], labels[train_part],
                                       prompt_lengths[train_part]) for w in _windows(*part)]
    test_windows = [w for part in zip(tokens[test_part], features[test_part], labels[test_part],
                                      prompt_lengths[test_part]) for w in _windows(*part)]
    _, baseline = bigram_baseline(tokens[train_part], labels[train_part], tokens[test_part], labels[test_part],
                                  prompt_lengths[train_part], prompt_lengths[test_part])
    steps_per_epoch = math.ceil(len(train_windows) / options.train_batch)
    total_steps = steps_per_epoch * options.epochs
    trained = dict(sequences=len(sequences), tokens=total, draft_vocab=vocab.numel(), held_out_sequences=held,
                   baseline=baseline)
    rng = random.Random(options.seed)
    warmup = max(1, min(50, total_steps // 10))

    # 4. Train, an epoch at a time, saving after each.
    for epoch in range(first_epoch, options.epochs):
        if time.monotonic() > deadline and history:
            break
        head.train()
        rng.shuffle(train_windows)
        losses = []
        for step in range(steps_per_epoch):
            global_step = epoch * steps_per_epoch + step
            # A short linear warm-up, then a cosine decay over the planned epochs.
            decay = 0.5 * (1 + math.cos(math.pi * global_step / total_steps))
            lr = options.lr * min(1.0, (global_step + 1) / warmup) * decay
            for group in optimizer.param_groups:
                group["lr"] = lr
            chunk = train_windows[step * options.train_batch:(step + 1) * options.train_batch]
            with torch.enable_grad():
                loss, *_ = head_losses(head, _batch(chunk, index, device, torch.float32))
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
                optimizer.step()
            losses.append(float(loss.detach()))
            if step % 10 == 0:
                yield Progress("train", (step + 1) / steps_per_epoch, f"epoch {epoch + 1}/{options.epochs}, "
                               f"step {step + 1}/{steps_per_epoch}, loss {sum(losses[-10:]) / len(losses[-10:]):.3f}",
                               epoch=epoch + 1, loss=losses[-1], baseline=baseline, history=list(history))
            if time.monotonic() > deadline and history:
                break
        agreement, agreement2 = evaluate(head, test_windows, index, device)
        history.append((epoch + 1, sum(losses) / len(losses), agreement, agreement2))
        head.eval()
        save_head(head, out, target=target, target_name=target_name, k=options.k,
                  trained={**trained, "epochs": epoch + 1, "history": history,
                           "minutes": round((time.monotonic() - started) / 60, 2)})
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "history": history,
                    "epoch": epoch + 1, "vocab": vocab, "config": head_config.to_dict()}, state_path)
        yield Progress("epoch", 1.0, f"epoch {epoch + 1}: loss {history[-1][1]:.3f}, held-out agreement "
                       f"{agreement:.1%} (second token {agreement2:.1%}; the last token's most frequent "
                       f"follower {baseline:.1%})", epoch=epoch + 1, loss=history[-1][1], agreement=agreement,
                       agreement2=agreement2, baseline=baseline, history=list(history))
    final = history[-1] if history else None
    yield Progress("done", 1.0, f"saved to {out}" + (f": held-out agreement {final[2]:.1%}" if final else ""),
                   epoch=len(history), agreement=final[2] if final else None,
                   agreement2=final[3] if final else None, baseline=baseline, history=list(history))


@torch.inference_mode()
def evaluate(head: DraftHead, windows: list[tuple], index: torch.Tensor, device) -> tuple[float, float]:
    """Held-out top-1 agreement with the target: of the first drafting step, of the second."""
    head.eval()
    hits = hits2 = scored = scored2 = 0
    for start in range(0, len(windows), 32):
        _, h, h2, s, s2 = head_losses(head, _batch(windows[start:start + 32], index, device, torch.float32))
        hits, hits2, scored, scored2 = hits + int(h), hits2 + int(h2), scored + int(s), scored2 + int(s2)
    return hits / max(scored, 1), hits2 / max(scored2, 1)
