"""The Run tab's handler on tiny in-process models: what it yields, how it fails, hosted limits."""

import html
import os
import re

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specviz import ui
from specviz.drafters import DraftModelDrafter, PromptLookupDrafter, early_exit_model
from specviz.events import Cycle, Step
from specviz.models import ModelLoadError, ModelPair, encode_prompt

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")
PROMPT = "Repeat: the cat sat on the mat. The cat sat on the mat. The cat sat on the"


def tiny_tokenizer():
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    text = ["the cat sat on the mat", "repeat after me: a dog ran in the park", "café naïve 日本"] * 5
    tok.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<eos>", "<|user|>", "<|assistant|>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_llama(vocab, seed, layers=2, context=512):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, initializer_range=0.3,
                         max_position_embeddings=context, bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = None
    return model


class FakeModels:
    """Stands in for specviz.models.load_pair: "tiny" (or None) is a 2-layer Llama; drafts are
    "ngram", "self:L", "same" (the target itself: everything accepted) and "random" (another model)."""

    def __init__(self):
        self.tokenizer = tiny_tokenizer()
        vocab = len(self.tokenizer)
        self.target = tiny_llama(vocab, 0, layers=3)
        self.random = tiny_llama(vocab, 1)
        self.short = tiny_llama(vocab, 0, context=32)
        self.calls = []

    def __call__(self, target, draft, progress=None):
        self.calls.append((target, draft))
        if progress is not None:
            progress(0.5, "loading the tiny model")
        if target not in (None, "tiny", "short-context"):
            raise ModelLoadError(f"{target!r} does not exist: no such file or folder.")
        model = self.short if target == "short-context" else self.target
        if draft == "ngram":
            drafter = PromptLookupDrafter()
        elif draft.startswith("self:"):
            drafter = DraftModelDrafter(early_exit_model(model, int(draft[5:])))
        elif draft == "same":
            drafter = DraftModelDrafter(model)
        elif draft == "random":
            drafter = DraftModelDrafter(self.random)
        else:
            raise ModelLoadError(f"{draft!r} does not exist.")
        return ModelPair(target=model, tokenizer=self.tokenizer, draft=drafter, target_name=target or "tiny",
                         draft_name=draft, target_parameters=1, draft_parameters=0, device=model.device,
                         dtype=torch.float32, eos_token_ids=[self.tokenizer.eos_token_id])


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # Tiny matrices gain nothing from threads, and on a shared machine they lose a lot to contention.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fake():
    return FakeModels()


def inputs(prompt=PROMPT, target="tiny", drafter=ui.PROMPT_LOOKUP, draft_model="", exit_layer=1, k=4,
           dynamic_k=False, temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=24, seed=0, prompt_format=ui.CHAT):
    return [prompt, target, drafter, draft_model, exit_layer, k, dynamic_k, temperature, top_p, top_k,
            max_new_tokens, seed, prompt_format]


def run(fake, hosted=False, **settings):
    handler = ui.make_run_handler(load=fake, hosted=hosted)
    return list(handler(*inputs(**settings)))


def verdicts(markup):
    return re.findall(r'data-verdict="(\w+)"', markup)


def text(markup):
    return re.sub(r"<[^>]+>", " ", markup)


# ----------------------------------------------------------------------------- runs

def test_run_streams_tokens_charts_and_summary(fake):
    views = run(fake, max_new_tokens=32)
    assert len(views) >= 2
    final = views[-1]
    assert isinstance(final, ui.RunView) and len(final) == 8
    found = verdicts(final.tokens)
    assert found and set(found) <= {"accepted", "rejected", "resampled", "bonus"}
    assert 'class="sv-cycle"' in final.tokens and "sv-legend" in final.tokens
    assert [t.name for t in final.acceptance.data] == ["this cycle", "cumulative"]
    assert [t.name for t in final.per_pass.data][:2] == ["this pass", "running mean"]
    assert [t.name for t in final.race.data] == ["speculative", "plain", "running speedup (right)"]
    assert final.race.data[0].y[-1] == 32 and final.race.data[1].y[-1] == 32
    assert len(final.positions.data[0].y) == 4
    summary = text(final.stats).lower()
    assert "acceptance" in summary and "speedup" in summary and "finished" in summary
    assert "identical" in summary  # greedy in float32: both methods write the same tokens
    assert final.last_stats == final.stats
    assert "32 tokens" in text(final.baseline) and "done" in text(final.baseline)


def test_first_view_says_it_is_loading(fake):
    views = run(fake)
    assert "Loading" in views[0].stats
    assert verdicts(views[0].tokens) == []


def test_same_draft_accepts_everything_and_random_draft_gets_rejections(fake):
    same = verdicts(run(fake, drafter=ui.DRAFT_MODEL, draft_model="same", k=3)[-1].tokens)
    assert set(same) == {"accepted", "bonus"}
    rejected = verdicts(run(fake, drafter=ui.DRAFT_MODEL, draft_model="random", k=3)[-1].tokens)
    assert "rejected" in rejected and "resampled" in rejected


def test_sampled_run_with_early_exit_and_dynamic_k(fake):
    final = run(fake, drafter=ui.EARLY_EXIT, exit_layer=1, temperature=1.0, top_p=0.9, top_k=50, seed=3,
                dynamic_k=True, prompt_format=ui.RAW)[-1]
    assert verdicts(final.tokens)
    assert "Sampled run" in final.stats and "speedup" in final.stats.lower()


def test_interleave_advances_the_method_that_is_behind():
    def cycle(i, seconds):
        return Cycle(index=i, k=1, drafted=[], num_accepted=0, emitted=[1], correction=1, correction_kind="bonus",
                     correction_prob=1.0, draft_probs=[], target_probs=[], uniforms=[], residual_top=[],
                     greedy=True, draft_seconds=0.0, verify_seconds=seconds)
    spec = iter([cycle(0, 0.3), cycle(1, 0.3)])
    plain = iter([Step(i, 1, 1.0, 0.1) for i in range(7)])
    order = ["S" if isinstance(e, Cycle) else "P" for e in ui.interleave(spec, plain)]
    assert order == ["S", "P", "P", "P", "S", "P", "P", "P", "P"]


# ----------------------------------------------------------------------------- failures

@pytest.mark.parametrize("settings, expected", [
    (dict(target="no-such/model"), "does not exist"),
    (dict(prompt="   "), "Type a prompt"),
    (dict(drafter=ui.DRAFT_MODEL, draft_model=""), "Type a draft model id"),
    (dict(target="short-context", max_new_tokens=40), "exceeds the target model's context of 32"),
    (dict(top_p=0.0), "top_p must be in (0, 1]"),
    (dict(max_new_tokens=5000), "Max new tokens must be between 1 and"),
    (dict(seed="x"), "Invalid setting"),
])
def test_errors_become_messages(fake, settings, expected):
    views = run(fake, **settings)
    final = views[-1]
    assert 'role="alert"' in final.stats and expected in html.unescape(final.stats)
    assert "Traceback" not in final.stats


def test_out_of_memory_is_reported_and_the_next_run_works(fake, monkeypatch):
    def boom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    monkeypatch.setattr(ui, "autoregressive_decode", boom)
    final = run(fake)[-1]
    assert "Out of memory" in final.stats
    monkeypatch.undo()
    assert "Finished" in run(fake)[-1].stats


def test_unexpected_errors_are_logged_not_shown(fake, caplog):
    def broken(target, draft, progress=None):
        raise RuntimeError("kaboom")
    final = list(ui.make_run_handler(load=broken, hosted=False)(*inputs()))[-1]
    assert "Unexpected error" in final.stats and "Traceback" not in final.stats
    assert "Traceback" in caplog.text or any(r.exc_info for r in caplog.records)


def test_stop_marks_the_last_summary():
    running = '<div class="sv-stats"><div class="sv-state">Running\u2026</div>acceptance 50%</div>'
    assert "Stopped" in ui.stopped(running) and "acceptance 50%" in ui.stopped(running)
    assert "Running" not in ui.stopped(running)
    assert "Stopped" in ui.stopped("")


# ----------------------------------------------------------------------------- hosted mode

def test_hosted_mode_is_on_with_the_variable_or_on_spaces(monkeypatch):
    monkeypatch.delenv("SPECVIZ_HOSTED", raising=False)
    monkeypatch.delenv("SPACE_ID", raising=False)
    assert not ui.is_hosted()
    monkeypatch.setenv("SPACE_ID", "someone/specviz")
    assert ui.is_hosted()
    monkeypatch.setenv("SPECVIZ_HOSTED", "0")
    assert not ui.is_hosted()
    monkeypatch.delenv("SPACE_ID")
    monkeypatch.setenv("SPECVIZ_HOSTED", "1")
    assert ui.is_hosted()


@pytest.mark.parametrize("settings, expected", [
    (dict(target="someone/big-model"), "only runs the preset models"),
    (dict(target="/tmp/model"), "Local paths"),
    (dict(drafter=ui.DRAFT_MODEL, draft_model="someone/other-draft"), "only runs the preset draft models"),
    (dict(max_new_tokens=ui.HOSTED_MAX_NEW_TOKENS + 8), f"between 1 and {ui.HOSTED_MAX_NEW_TOKENS}"),
])
def test_hosted_mode_limits(fake, settings, expected):
    settings.setdefault("target", "")
    final = run(fake, hosted=True, **settings)[-1]
    assert expected in final.stats
    assert not any(call[0] == settings["target"] and settings["target"] for call in fake.calls)


def test_hosted_mode_runs_the_default_and_preset_drafters(fake):
    assert "Finished" in run(fake, hosted=True, target="")[-1].stats
    assert "Finished" in run(fake, hosted=True, target="", drafter=ui.EARLY_EXIT, exit_layer=1)[-1].stats


# ----------------------------------------------------------------------------- layout

def test_presets_fill_the_controls():
    presets = [dict(name="a", target="T", draft="ngram", k=8), dict(name="b", target="T", draft="self:20", k=4),
               dict(name="c", target="T", draft="org/small", k=5)]
    assert ui.preset_settings("a", presets)["drafter"] == ui.PROMPT_LOOKUP
    assert ui.preset_settings("b", presets) | {} == dict(target="T", draft_model="", exit_layer=20, k=4,
                                                          drafter=ui.EARLY_EXIT)
    assert ui.preset_settings("c", presets)["draft_model"] == "org/small"
    assert ui.preset_settings(ui.CUSTOM, presets) == {}
    assert ui.preset_choices(presets, hosted=True) == ["a", "b", "c"]
    assert ui.preset_choices(presets, hosted=False)[-1] == ui.CUSTOM


def test_examples_cover_every_category():
    categories = {e["category"] for e in ui.load_examples()}
    assert categories == {"chat", "code", "rewrite/edit", "summarisation", "maths", "translation"}


def test_build_demo_has_the_run_tab_ids_and_one_gpu_queue(fake):
    demo = ui.build_demo(load=fake, hosted=False)
    config = demo.get_config_file()
    ids = {c["props"].get("elem_id") for c in config["components"]}
    assert {"prompt", "run", "stop", "tokens", "charts", "stats"} <= ids
    tabs = [c for c in config["components"] if c["type"] == "tabitem"]
    assert tabs[0]["props"]["label"] == "Run"
    run_events = [d for d in config["dependencies"] if d.get("api_name") == "run"]
    assert len(run_events) == 1
    run_fn = demo.fns[run_events[0]["id"]]
    assert run_fn.concurrency_id == ui.CONCURRENCY_ID and run_fn.concurrency_limit == 1
    assert any(run_events[0]["id"] in d.get("cancels", []) for d in config["dependencies"])  # Stop
    assert demo._queue.max_size == ui.QUEUE_MAX_SIZE


def test_hosted_demo_hides_typed_ids(fake):
    config = ui.build_demo(load=fake, hosted=True).get_config_file()
    target = next(c for c in config["components"] if c["props"].get("elem_id") == "target")
    assert target["props"]["visible"] is False
    limit = next(c for c in config["components"] if c["props"].get("elem_id") == "max-new-tokens")
    assert limit["props"]["maximum"] == ui.HOSTED_MAX_NEW_TOKENS


def test_gpu_task_is_a_no_op_without_spaces():
    def handler():
        yield 1
    wrapped = ui.gpu_task(handler)
    assert list(wrapped()) == [1]


def test_real_encoder_works_with_the_fake_pair(fake):
    ids = encode_prompt(fake.tokenizer, "the cat", chat=True)
    assert ids.shape[0] == 1 and ids.shape[1] > 2
