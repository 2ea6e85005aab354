"""Training an EAGLE-3 draft head (core.eagle3) for a target, from the target itself (self-distillation;
steps 1-3's text, features and vocabulary are runs.head_data's):

1. The target writes the training text: its own greedy continuations of the prompts, in batches
   (core.plain's batched decoding). Saved as `sequences.json` in the output folder.
2. One target forward per few sequences gives, at every position, its hidden states at the head's
   three layers (the head's input) and its next-token distribution, kept as its top `top_k`
   probabilities (the soft targets; the argmax is the top-1 label).
3. The draft vocabulary: the most frequent top-1 labels of the replies (at most `draft_vocab`).
4. Training, on whole sequences at their real positions (no windows cut from position 0): the
   training-time test unrolls `steps` drafting steps (`Eagle3Head.unrolled`: step s reads step
   s - 1's own output, as drafting does), each scored by cross-entropy against the target's
   distribution over the draft vocabulary, step s weighted 0.8^s. Only the replies' positions are
   scored (the prompt is read as context). Each epoch ends with the held-out top-1 agreement with the
   target per step, and the head saved in the speculators format, in the dtype trained (fp32): Ctrl-C
   keeps the last finished epoch, and a second run with the same folder resumes from it.

`train_head` yields one `Progress` per report; the command line and the app render them."""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from transformers import LlamaConfig

from ..core.eagle3 import Eagle3Head, default_layer_ids
from ..errors import SpecvizError
from ..models.head_files import spec_location
from ..models.heads import load_head, save_head, verifier_location
from ..settings import parse_draft
from .head_data import (SEED, batched_target_features, bigram_baseline, choose_vocab, generate_sequences,
                        held_out_count, shuffled)

MIN_TRAINING_TOKENS = 2_000       # below this a head learns nothing worth drafting with
MAX_LENGTH = 768                  # positions of a sequence trained on (longer ones are cut)
FEATURE_BATCH = 8                 # sequences per target forward when collecting features
STEP_WEIGHT = 0.8                 # the training-time test's step s counts 0.8^s
NEW_HEAD_K = 3                    # a new head's default draft length (the training-time test's steps)
SEQUENCES, STATE = "sequences.json", "training.pt"


@dataclass(frozen=True)
class TrainOptions:
    tokens: int = 60_000              # generated tokens to train on (the prompts' tokens come on top)
    minutes: float = 20.0             # wall-clock budget, generation and training together
    max_new_tokens: int = 192         # per continuation
    batch: int = 64                   # prompts generated together (measured here: 569 tokens/s at 64, bf16)
    epochs: int = 8
    draft_vocab: int = 8192
    intermediate: int = 1536          # the head's MLP width
    lr: float = 1e-3
    train_batch: int = 4              # sequences per optimizer step
    seed: int = SEED
    k: int | None = None              # the draft length written as the head's default (None: NEW_HEAD_K,
                                      # or the head training starts from keeps its own)
    steps: int = 3                    # drafting steps unrolled in training (the training-time test)
    top_k: int = 16                   # the target's most probable tokens kept per position (soft targets)


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
    k: int | None = None              # the saved head's default draft length (from the first save on)


def _new_head(target, config, vocab: torch.Tensor, layers: Sequence[int], options: TrainOptions) -> Eagle3Head:
    """A fresh head for `target`: one Llama layer of the target's width and heads, its output rows and
    final norm the target's own (rows of the draft vocabulary)."""
    layer_config = LlamaConfig(vocab_size=config.vocab_size, hidden_size=config.hidden_size,
                               intermediate_size=options.intermediate, num_hidden_layers=1,
                               num_attention_heads=config.num_attention_heads,
                               num_key_value_heads=getattr(config, "num_key_value_heads", None)
                               or config.num_attention_heads,
                               head_dim=getattr(config, "head_dim", None),
                               max_position_embeddings=config.max_position_embeddings,
                               rms_norm_eps=getattr(config, "rms_norm_eps", 1e-5),
                               rope_parameters=getattr(config, "rope_parameters", None))
    head = Eagle3Head(layer_config, draft_vocab_size=vocab.numel(), target_hidden_size=config.hidden_size,
                      layer_ids=layers, norm_before_residual=False)
    head.set_vocab(vocab)
    with torch.no_grad():
        head.lm_head.weight.copy_(target.get_output_embeddings().weight[vocab.to(target.device)].float().cpu())
        final_norm = getattr(target.get_decoder(), "norm", None)
        if final_norm is not None and final_norm.weight.shape == head.norm.weight.shape:
            head.norm.weight.copy_(final_norm.weight.float().cpu())
    return head


def _examples(tokens: torch.Tensor, aux: torch.Tensor, probs: torch.Tensor, ids: torch.Tensor,
              prompt_length: int = 0) -> tuple:
    """A sequence of n tokens as one example at its real positions: position i reads (h_i, token i+1)
    and is scored against the target's distribution at i+1 (its choice of token i+2), i = 0..n-2;
    only replies are scored (i+1 >= the prompt's length: a fixed chat template and system prompt are
    easy to learn and would inflate the agreement)."""
    n = min(tokens.shape[0], MAX_LENGTH)
    scored = torch.arange(1, n) >= prompt_length
    return aux[:n - 1], tokens[1:n], probs[1:n], ids[1:n], scored


def _batch(examples: list[tuple], index: torch.Tensor, device, dtype):
    """Right-padded tensors of a few sequences; soft targets as (draft ids, probabilities) with ids
    outside the draft vocabulary at probability 0 (they cannot be drafted)."""
    length = max(e[0].shape[0] for e in examples)

    def pad(tensors, value=0):
        return torch.stack([F.pad(t, (0, 0, 0, length - t.shape[0]) if t.dim() == 2 else (0, length - t.shape[0]),
                                  value=value) for t in tensors]).to(device)

    aux = pad([e[0] for e in examples]).to(dtype)
    tokens = pad([e[1] for e in examples])
    draft_ids = pad([index[e[3].long()] for e in examples], value=-100)
    probs = pad([e[2].float() for e in examples]).masked_fill(draft_ids < 0, 0.0)
    label = pad([index[e[3][:, 0].long()] for e in examples], value=-100)     # the target's argmax, in draft ids
    scored = pad([e[4] for e in examples], value=False)
    return aux, tokens, draft_ids, probs, label, scored


def head_losses(head: Eagle3Head, batch, steps: int):
    """(loss, per-step top-1 hits (steps,), per-step scored positions (steps,)) of the training-time test."""
    aux, tokens, draft_ids, probs, label, scored = batch
    outs = head.unrolled(head.fuse(aux), tokens, steps)
    loss = aux.new_zeros((), dtype=torch.float32)
    hits, counts = torch.zeros(steps, dtype=torch.long), torch.zeros(steps, dtype=torch.long)
    mass = probs.sum(-1, keepdim=True)
    for step, out in enumerate(outs):
        valid = scored.clone()
        valid[:, :step] = False                       # no chain of this depth starts before position 0
        logp = torch.log_softmax(head.logits(out).float(), dim=-1)
        # Soft cross-entropy against the target's distribution over the draft vocabulary (renormalised).
        picked = logp.gather(-1, draft_ids.clamp(min=0))
        per_position = -(picked * probs).sum(-1) / mass.squeeze(-1).clamp(min=1e-6)
        weight = valid & (mass.squeeze(-1) > 0)
        if bool(weight.any()):
            loss = loss + STEP_WEIGHT ** step * per_position[weight].mean()
        hits[step] = ((logp.argmax(-1) == label) & (label >= 0) & valid).sum()
        counts[step] = valid.sum()
    return loss, hits, counts


# ----------------------------------------------------------------------------- the whole run

def train_head(target, tokenizer, prompts: Sequence[str], out: Path | str, *, target_name: str,
               eos: Sequence[int] = (), options: TrainOptions = TrainOptions(), chat: bool = True,
               start: str | None = None) -> Iterator[Progress]:
    """Generate, collect features, train, save after each epoch (module docstring). Resumes from `out`.
    With `start` ('head': the one shipped for the target; 'head:DIR_OR_ID') training goes on from that
    head's weights (read in float32), with its layers, draft vocabulary and shape, on the new text:
    fine-tuning a shipped or downloaded head."""
    if start is not None:
        spec = parse_draft(start)
        if spec.kind != "head":
            raise SpecvizError(f"Start from {start!r}: a draft head to go on training, 'head' (the one shipped for "
                               "the target) or 'head:DIR_OR_ID'.")
        start = load_head(spec_location(spec, target_name), target, target_name=target_name, name=spec,
                          dtype=torch.float32, int8=False)
    config = target.config.get_text_config()
    # The layers read, checked before the minutes of generation (fewer than 3 target layers: refused).
    try:
        layers = tuple(start.hidden_layers) if start is not None else default_layer_ids(config.num_hidden_layers)
    except ValueError as error:
        raise SpecvizError(str(error)) from None
    k = options.k or (start.default_k if start is not None else NEW_HEAD_K)
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
        order = shuffled(prompts, options.seed)
        generation_deadline = started + options.minutes * 60 * 0.5   # half of the budget at most
        for report in generate_sequences(target, tokenizer, order, tokens=options.tokens,
                                         max_new_tokens=options.max_new_tokens, batch=options.batch, eos=eos,
                                         deadline=generation_deadline, chat=chat):
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

    # 2. Features and soft targets, one target forward per few sequences.
    tokens, features, probs, top_ids = [], [], [], []
    for i in range(0, len(sequences), FEATURE_BATCH):
        batch = [s[:MAX_LENGTH] for s in sequences[i:i + FEATURE_BATCH]]
        for sequence, (f, p, ids) in zip(batch, batched_target_features(target, batch, layers, options.top_k)):
            tokens.append(torch.tensor(sequence)), features.append(f), probs.append(p), top_ids.append(ids)
        if i % (4 * FEATURE_BATCH) == 0 or len(tokens) == len(sequences):
            yield Progress("features", len(tokens) / len(sequences),
                           f"target features of {len(tokens)}/{len(sequences)} sequences")
    labels = [ids[:, 0].long() for ids in top_ids]
    held = held_out_count(len(sequences))
    train_part, test_part = slice(held, None), slice(0, held)

    # 3. The draft vocabulary and the head; its final norm and output rows start as the target's own
    # (or, from a `start` head, everything is that head's).
    vocab_size = config.vocab_size
    if start is not None:
        vocab = start.head.vocab.cpu()
        head = start.head.to(device=device, dtype=torch.float32).bind(target)
    else:
        responses = [lab[length:] for lab, length in zip(labels[train_part], prompt_lengths[train_part])]
        vocab = choose_vocab(responses, options.draft_vocab, always=list(eos))
        head = _new_head(target, config, vocab, layers, options).to(device=device, dtype=torch.float32).bind(target)
    index = torch.full((vocab_size,), -100, dtype=torch.long)
    index[vocab] = torch.arange(vocab.numel())
    shape = {"layers": list(layers), "draft_vocab": vocab.numel(), "intermediate": head.layer_config.intermediate_size}
    if start is not None:
        shape["started_from"] = str(start.name)
    optimizer = torch.optim.AdamW(head.parameters(), lr=options.lr, weight_decay=0.0)
    history, first_epoch, before = [], 0, None
    state_path = out / STATE
    if state_path.is_file():
        saved = torch.load(state_path, weights_only=False)
        if saved["vocab"].tolist() == vocab.tolist() and saved.get("shape") == shape:
            head.load_state_dict(saved["head"])
            optimizer.load_state_dict(saved["optimizer"])
            history, first_epoch, before = saved["history"], saved["epoch"], saved.get("agreement_before")
            yield Progress("train", 0.0, f"resuming after epoch {first_epoch}", epoch=first_epoch, history=history)

    train_examples = [_examples(*part) for part in zip(tokens[train_part], features[train_part], probs[train_part],
                                                       top_ids[train_part], prompt_lengths[train_part])]
    test_examples = [_examples(*part) for part in zip(tokens[test_part], features[test_part], probs[test_part],
                                                      top_ids[test_part], prompt_lengths[test_part])]
    _, baseline = bigram_baseline(tokens[train_part], labels[train_part], tokens[test_part], labels[test_part],
                                  prompt_lengths[train_part], prompt_lengths[test_part])
    steps_per_epoch = math.ceil(len(train_examples) / options.train_batch)
    total_steps = steps_per_epoch * options.epochs
    trained = dict(sequences=len(sequences), tokens=total, draft_vocab=vocab.numel(), held_out_sequences=held,
                   baseline=baseline, steps=options.steps, top_k=options.top_k, dtype="float32")
    if start is not None:
        trained["started_from"] = str(start.name)
        if start.trained:               # how the head training starts from was trained, kept beside this
            trained["started_from_training"] = start.trained
        if before is None:              # the head's held-out agreement on the new text before training on it
            before = evaluate(head, test_examples, index, device, options.steps)
            yield Progress("train", 0.0, f"{start.name} before training: held-out agreement {before[0]:.1%} "
                           f"(second token {before[1] if len(before) > 1 else 0.0:.1%})", baseline=baseline)
    rng = random.Random(options.seed)
    warmup = max(1, min(50, total_steps // 10))

    # 4. Train, an epoch at a time, saving after each.
    for epoch in range(first_epoch, options.epochs):
        if time.monotonic() > deadline and history:
            break
        head.train()
        rng.shuffle(train_examples)
        losses = []
        for step in range(steps_per_epoch):
            global_step = epoch * steps_per_epoch + step
            # A short linear warm-up, then a cosine decay over the planned epochs.
            decay = 0.5 * (1 + math.cos(math.pi * global_step / total_steps))
            lr = options.lr * min(1.0, (global_step + 1) / warmup) * decay
            for group in optimizer.param_groups:
                group["lr"] = lr
            chunk = train_examples[step * options.train_batch:(step + 1) * options.train_batch]
            with torch.enable_grad():
                loss, *_ = head_losses(head, _batch(chunk, index, device, torch.float32), options.steps)
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
        per_step = evaluate(head, test_examples, index, device, options.steps)
        agreement, agreement2 = per_step[0], per_step[1] if len(per_step) > 1 else 0.0
        history.append((epoch + 1, sum(losses) / len(losses), agreement, agreement2))
        head.eval()
        save_head(head, out, target_name=target_name, k=k, verifier=verifier_location(target, target_name),
                  trained={**trained, "epochs": epoch + 1, "history": history, "agreement_per_step": per_step,
                           "minutes": round((time.monotonic() - started) / 60, 2),
                           **({"agreement_before": before} if before is not None else {})})
        torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(), "history": history,
                    "epoch": epoch + 1, "vocab": vocab, "shape": shape, "agreement_before": before}, state_path)
        yield Progress("epoch", 1.0, f"epoch {epoch + 1}: loss {history[-1][1]:.3f}, held-out agreement "
                       f"{agreement:.1%} (second token {agreement2:.1%}; the last token's most frequent "
                       f"follower {baseline:.1%})", epoch=epoch + 1, loss=history[-1][1], agreement=agreement,
                       agreement2=agreement2, baseline=baseline, history=list(history), k=k)
    final = history[-1] if history else None
    yield Progress("done", 1.0, f"saved to {out}" + (f": held-out agreement {final[2]:.1%}" if final else ""),
                   epoch=len(history), agreement=final[2] if final else None,
                   agreement2=final[3] if final else None, baseline=baseline, history=list(history), k=k)


@torch.inference_mode()
def evaluate(head: Eagle3Head, examples: list[tuple], index: torch.Tensor, device, steps: int) -> list[float]:
    """Held-out top-1 agreement with the target of each drafting step (step s from the head's own
    outputs of the steps before)."""
    head.eval()
    hits, counts = torch.zeros(steps, dtype=torch.long), torch.zeros(steps, dtype=torch.long)
    for start in range(0, len(examples), 8):
        _, h, c = head_losses(head, _batch(examples[start:start + 8], index, device, torch.float32), steps)
        hits, counts = hits + h, counts + c
    return [int(h) / max(int(c), 1) for h, c in zip(hits, counts)]
