"""What a speedup compares, in words: which tokens (`equal_work`: all, the same text near-ties apart,
the shared prefix, equal lengths), on which clock, and, where greedy outputs part, why and what then
counts. Pure functions of `Run`; `prose` says the rest of a run."""

from __future__ import annotations

from ..clocks import clock_text
from ..equal_work import ALONG_NEAR_TIES, EQUAL_LENGTH, SHARED_PREFIX
from ..runs.result import Run


def no_speed_text(run: Run) -> str:
    """Why a run has no speedup yet (or at all)."""
    work = run.compared
    if work.parted_at is not None and run.done:
        return (f"none: the outputs part at token {work.parted_at}, too early for a speedup over the tokens "
                "both wrote")
    return "waiting for both methods to pass their prefill"


def work_text(run: Run) -> str:
    """Which tokens the speedup compares (`equal_work.equal_work`): every one, the shared prefix of
    greedy outputs that parted, or equal lengths of sampled ones."""
    work = run.compared
    if work.basis == SHARED_PREFIX:
        return (f"the first {work.tokens} tokens, which both wrote (the outputs part at token {work.parted_at}; "
                f"the speculative side wrote {run.stats.tokens} in all, plain {len(run.steps)})")
    if work.basis == ALONG_NEAR_TIES:
        which = f"the same {work.tokens} tokens" if work.tokens == run.stats.tokens else \
            f"the first {work.tokens} tokens (plain decoding's own argmax further on was more than a near-tie away)"
        return (f"{which}: the speculative text, and plain decoding's steps along it after the outputs part at "
                f"token {work.parted_at} ({ties_text(work.near_ties)}; timed after the race)")
    if work.basis == EQUAL_LENGTH:
        return (f"the first {work.tokens} tokens of each (sampled: the two texts differ by design; speculative "
                f"wrote {run.stats.tokens} in all, plain {len(run.steps)})")
    if run.done and work.tokens == run.stats.tokens == len(run.steps):
        return f"the same {work.tokens} tokens, written by both"
    return f"the first {work.tokens} tokens, written by both so far"


def ties_text(ties) -> str:
    """Where plain decoding, stepped along the speculative text, would have chosen another token (a
    near-tie of the logits: position, margin)."""
    if not ties:
        return "where its own argmax agreed at every token"
    shown = ", ".join(f"token {at} (a tie)" if margin == 0 else f"token {at} by {margin:.3g}"
                      for at, margin in ties[:3])
    return (f"where its own argmax was another token by a near-tie of the logits only: {shown}"
            + (f" and {len(ties) - 3} more" if len(ties) > 3 else ""))


def compared_text(run: Run) -> str:
    """What the speedup compares, on which clock."""
    speed = run.speed
    if speed is None:
        return ""
    return (f"decode-only time per token over {work_text(run)}; prefill apart: speculative "
            f"{speed.spec_prefill_seconds:.3f} s, plain {speed.plain_prefill_seconds:.3f} s; "
            f"timed by {clock_text(run.clock)}")


def float32_advice(device: str) -> str:
    """What float32 buys, by the dtype policy (`models.devices.auto_dtype`): on a CPU it is what 'auto'
    picks and keeps greedy outputs identical; on a GPU 'auto' is the serving dtype (bf16 or fp16)."""
    if device.startswith("cuda"):
        return ("Choose dtype float32 for outputs closer to plain decoding's ('auto' on a GPU is the serving dtype, "
                "bf16 or fp16; even float32 is not bit-exact across shapes on a GPU)")
    return "Choose dtype float32 (what 'auto' picks on a CPU) for identical outputs"


def parted_text(run: Run) -> str | None:
    """For a greedy race whose outputs part: what happened and what the speedup compares (shown before
    the headline: the method's promise is identical output). None otherwise."""
    work = run.compared
    if work.parted_at is None:
        return None
    reduced = run.dtype in ("bfloat16", "float16")
    why = (f"in {run.dtype} a one-token step and a multi-token pass round differently, and at a near-tie of the "
           "top two logits the argmax flips" if reduced else
           "a one-token step and a multi-token pass differ numerically at a near-tie of the top two logits")
    advice = f" {float32_advice(run.device)}." if reduced else ""
    compared = ("Too few tokens were written alike for a speedup." if run.speed is None else
                f"The speedup compares the same {work.tokens} tokens: plain decoding, stepped along the speculative "
                f"text after the race, writes it too but for near-ties." if work.basis == ALONG_NEAR_TIES else
                f"The speedup compares the {work.tokens} tokens both wrote.")
    return f"Greedy outputs part at token {work.parted_at}: {why}. {compared}{advice}"
