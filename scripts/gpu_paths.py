"""The own loop's CUDA paths, checked on a lent GPU in one command (torch + transformers only: no
network, no gradio, no vLLM). scripts/gpu_bench.py measures speed; this checks what must hold:

1. `core.timing.Clock` on `cuda:N` times that device's work: a run of matrix products launched on
   cuda:N, timed by the Clock, takes at least what CUDA events on that device say (a Clock that
   synchronised another device would read only the launch). Every visible GPU is checked, the last
   one (not the default device) when there are several.
2. The batched loop: `batched_speculative_decode` over 4 prompts of different lengths, drafting with
   a draft model, prompt lookup and early exit, equals `batched_autoregressive_decode` of the same
   prompts, request by request (greedy, float32, random Llamas whose logits are spread out so that
   no argmax is a near-tie).
3. The head: an untrained EAGLE-3 head (`Eagle3Head`) bound to the target on the device drafts in the batched loop
   (its features, cache and LM head rows on cuda), again equal to plain decoding; once more in
   bfloat16 (run only: no equality promised there).
4. Out-of-memory recovery: the loop is run with a batch too large for a memory cap
   (`torch.cuda.set_per_process_memory_fraction`); the error is what `errors.is_out_of_memory` knows,
   `errors.user_message` frees the cache (memory reserved falls back), and the same run under no cap
   then finishes.
5. The dtype and memory policy on the real card (`models.devices.auto_dtype`, `models.memory`): a saved
   bf16 checkpoint and a float32 one load with dtype "auto" in the card's half precision, on the
   named card, whatever is free; the budget the card reports is sane (total as torch says, specviz's
   cached models counted as its own); a pair sized like a 400B model is refused before any weight loads.

Results: $OUT/gpu_paths.json and a line per check on stdout; exit status 1 if any check fails.

    python scripts/gpu_paths.py                  # every visible GPU; under a minute
    python scripts/gpu_paths.py --device cpu     # the CPU dry run: checks 2 and 3 (1 and 4 need CUDA)
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from specviz.core.decoding import batched_speculative_decode  # noqa: E402
from specviz.core.drafters import PromptLookupDrafter  # noqa: E402
from specviz.core.events import row_outputs  # noqa: E402
from specviz.core.eagle3 import Eagle3Head  # noqa: E402
from specviz.core.head import HeadDrafter  # noqa: E402
from specviz.core.plain import batched_autoregressive_decode  # noqa: E402
from specviz.core.timing import Clock  # noqa: E402
from specviz.errors import OUT_OF_MEMORY, is_out_of_memory, user_message  # noqa: E402
from specviz.models import make_drafter  # noqa: E402

VOCAB, NEW_TOKENS, K = 512, 24, 4


def llama(seed: int, layers: int, hidden: int, device, dtype=torch.float32):
    # A wide initialiser spreads the logits: greedy argmax is then not decided by round-off between a
    # one-token step and a multi-token pass (as tests/conftest.make_llama).
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.device(device):
        model = LlamaForCausalLM(config).to(dtype).eval()
    model.generation_config.eos_token_id = None
    return model


def prompts(seed: int = 0) -> list[list[int]]:
    """Four prompts of different lengths, each repeating itself (something for prompt lookup to find)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for length in (6, 11, 17, 9):
        half = torch.randint(0, VOCAB, (length,), generator=generator).tolist()
        out.append(half + half)
    return out


def head_drafter(target, seed: int = 0) -> HeadDrafter:
    """An untrained head over the whole vocabulary (exactness holds for any draft), on the target's device."""
    torch.manual_seed(seed)
    config = target.config
    layer = LlamaConfig(vocab_size=VOCAB, hidden_size=config.hidden_size, intermediate_size=2 * config.hidden_size,
                        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4)
    layers = tuple(range(config.num_hidden_layers + 1))[-3:]
    head = Eagle3Head(layer, draft_vocab_size=VOCAB, target_hidden_size=config.hidden_size, layer_ids=layers)
    head = head.set_vocab(torch.arange(VOCAB)).to(device=target.device, dtype=target.dtype)
    return HeadDrafter(head.bind(target))


# ----------------------------------------------------------------------------- the checks

def check_clock(device: torch.device) -> dict:
    clock = Clock(device)
    a = torch.randn(2048, 2048, device=device)
    for _ in range(3):
        a @ a                                 # warm-up (cuBLAS handles)
    torch.cuda.synchronize(device)
    # Not under `torch.cuda.device(device)`: the current device stays cuda:0, as in the app.
    stream = torch.cuda.current_stream(device)
    start_event, end_event = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start_event.record(stream)
    began = clock()
    for _ in range(50):
        a = (a @ a) / 2048
    ended = clock()
    end_event.record(stream)
    torch.cuda.synchronize(device)
    device_seconds = start_event.elapsed_time(end_event) / 1e3
    clock_seconds = ended - began
    return {"check": f"Clock on {device}", "clock": clock.name, "clock_seconds": clock_seconds,
            "cuda_event_seconds": device_seconds, "current_device": torch.cuda.current_device(),
            "ok": clock_seconds >= 0.9 * device_seconds}


def check_batched(device: torch.device) -> dict:
    target = llama(0, layers=4, hidden=128, device=device)
    draft = llama(1, layers=1, hidden=64, device=device)
    batch = prompts()
    plain = row_outputs(batched_autoregressive_decode(target, batch, max_new_tokens=NEW_TOKENS))
    drafters = {"draft model": make_drafter("draft-model", target, draft_model=draft),
                "prompt lookup": PromptLookupDrafter(), "early exit": make_drafter("self:2", target)}
    results, ok = {}, True
    for name, drafter in drafters.items():
        began = time.perf_counter()
        out = row_outputs(batched_speculative_decode(target, drafter, batch, max_new_tokens=NEW_TOKENS, k=K))
        same = [out[row] == plain[row] for row in range(len(batch))]
        results[name] = {"identical_rows": sum(same), "rows": len(batch), "seconds": time.perf_counter() - began}
        ok &= all(same)
    return {"check": f"batched loop on {device}", "drafters": results, "ok": ok}


def check_head(device: torch.device) -> dict:
    target = llama(0, layers=4, hidden=128, device=device)
    batch = prompts(1)
    plain = row_outputs(batched_autoregressive_decode(target, batch, max_new_tokens=NEW_TOKENS))
    out = row_outputs(batched_speculative_decode(target, head_drafter(target), batch, max_new_tokens=NEW_TOKENS, k=K))
    same = [out[row] == plain[row] for row in range(len(batch))]
    low = llama(0, layers=4, hidden=128, device=device, dtype=torch.bfloat16)
    low_out = row_outputs(batched_speculative_decode(low, head_drafter(low), batch, max_new_tokens=NEW_TOKENS, k=K))
    return {"check": f"head in the batched loop on {device}", "identical_rows": sum(same), "rows": len(batch),
            "bfloat16_tokens": sum(len(v) for v in low_out.values()),
            "ok": all(same) and all(len(v) == NEW_TOKENS for v in low_out.values())}


def check_out_of_memory(device: torch.device) -> dict:
    target = llama(0, layers=4, hidden=512, device=device)
    drafter = PromptLookupDrafter()
    big = [p * 40 for p in prompts(2)] * 64        # 256 prompts of ~700 tokens: far over a small cap
    torch.cuda.synchronize(device)
    baseline = torch.cuda.memory_reserved(device)
    total = torch.cuda.get_device_properties(device).total_memory
    cap = (baseline + (256 << 20)) / total          # what the model holds and 256 MiB more
    torch.cuda.set_per_process_memory_fraction(cap, device)
    error = None
    try:
        for _ in batched_speculative_decode(target, drafter, big, max_new_tokens=NEW_TOKENS, k=K):
            pass
    except Exception as exc:  # noqa: BLE001 - the check is what kind of error it is
        error = exc
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    recognised = error is not None and is_out_of_memory(error)
    peak_reserved = torch.cuda.memory_reserved(device)
    message = user_message(error) if error is not None else None
    gc.collect()
    after = torch.cuda.memory_reserved(device)
    # the same loop, now uncapped, on a smaller batch: the device works again
    out = row_outputs(batched_speculative_decode(target, drafter, big[:8], max_new_tokens=NEW_TOKENS, k=K))
    return {"check": f"out-of-memory recovery on {device}", "error": repr(error)[:300] if error else None,
            "recognised": recognised, "message_is_the_users": message == OUT_OF_MEMORY,
            "reserved_before_mib": baseline / 2**20, "reserved_at_error_mib": peak_reserved / 2**20,
            "reserved_after_mib": after / 2**20, "rows_after": len(out),
            "ok": recognised and message == OUT_OF_MEMORY and after <= baseline + (64 << 20) and len(out) == 8}


def check_policy(device: torch.device) -> dict:
    import tempfile

    from specviz.errors import SpecvizError
    from specviz.models import load_pair
    from specviz.models.cache import model_cache
    from specviz.models.memory import read_gpu_memory

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    folder = Path(tempfile.mkdtemp(prefix="specviz-gpu-policy-"))
    words = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="w0", eos_token="w1")
    loaded = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        model = llama(0, layers=2, hidden=64, device="cpu", dtype=dtype)
        model.config.dtype = dtype
        model.save_pretrained(folder / name)
        tokenizer.save_pretrained(folder / name)
        pair = load_pair(str(folder / name), "ngram", device=str(device), dtype="auto")
        loaded[name] = (str(pair.dtype), str(pair.target.device))
    card = read_gpu_memory(device)
    total = torch.cuda.get_device_properties(device).total_memory
    big = llama(0, layers=2, hidden=64, device="meta").config
    big.hidden_size, big.intermediate_size, big.num_hidden_layers, big.vocab_size = 16384, 53248, 126, 128256
    big.num_attention_heads, big.num_key_value_heads, big.head_dim = 128, 8, 128
    big.save_pretrained(folder / "huge")
    tokenizer.save_pretrained(folder / "huge")
    before = len(model_cache)
    try:
        load_pair(str(folder / "huge"), "ngram", device=str(device))
        refused = None
    except SpecvizError as error:
        refused = str(error)
    ok = (all(dtype == str(half) and where == str(device) for dtype, where in loaded.values())
          and card.total == total and card.held >= model_cache.bytes_on(device) > 0 and refused is not None
          and "Nothing was loaded" in refused and len(model_cache) == before)
    return {"check": f"dtype and memory policy on {device}", "loaded": loaded, "half": str(half),
            "budget_gb": card.budget / 1e9, "held_gb": card.held / 1e9, "others_gb": card.others / 1e9,
            "refused": refused, "ok": ok}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (every visible GPU), cuda:N, or cpu (dry run)")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu_paths_out"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_grad_enabled(False)

    if args.device == "cuda":
        if not torch.cuda.is_available():
            sys.exit("No CUDA device: run with --device cpu for the dry run.")
        devices = [torch.device(f"cuda:{i}") for i in range(torch.cuda.device_count())]
    else:
        devices = [torch.device(args.device)]
    report = {"torch": torch.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
              "devices": [torch.cuda.get_device_name(d) if d.type == "cuda" else "cpu" for d in devices],
              "checks": []}
    # The last device is the one that is not the default (cuda:0) when there are several.
    device = devices[-1]
    checks = [check_batched, check_head] + ([check_out_of_memory, check_policy] if device.type == "cuda" else [])
    plan = ([partial(check_clock, d) for d in devices] if device.type == "cuda" else []) + \
        [partial(check, device) for check in checks]
    if device.type != "cuda":
        report["skipped"] = ["Clock on cuda:N, out-of-memory recovery and the dtype and memory policy need CUDA"]
    for run in plan:
        try:
            result = run()
        except Exception as exc:  # noqa: BLE001 - a failed check is reported, the others still run
            result = {"check": f"{run.func.__name__} on {run.args[0]}", "error": repr(exc)[:500], "ok": False}
        report["checks"].append(result)
        print(("ok    " if result["ok"] else "FAIL  ") + json.dumps(result), flush=True)
        (args.out / "gpu_paths.json").write_text(json.dumps(report, indent=2))
    failed = [c["check"] for c in report["checks"] if not c["ok"]]
    print(f"{len(report['checks']) - len(failed)} of {len(report['checks'])} checks passed"
          + (f"; failed: {', '.join(failed)}" if failed else "") + (f"; skipped: {report['skipped'][0]}"
                                                                     if report.get("skipped") else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
