"""The GPU decisions (dtype "auto", the memory budget, devices) on this CPU against faked CUDA cards.

What is faked is the hardware only: torch.cuda's answers about a card (present, how many, its total
and free memory, bf16 support, its name, what this process's allocator holds). specviz's own code runs
as it would on the card; nothing here allocates on a GPU. The configs are real model configs (their
sizes as published), so the figures are the ones a user of these models would meet."""

import json
from types import SimpleNamespace

import pytest
import torch

from specviz.errors import SpecvizError
from specviz.models import auto_dtype, checkpoint_dtype, resolve_device
from specviz.models.cache import model_cache
from specviz.models.loading import estimate_bytes, fit_on_gpu, pick_dtype
from specviz.models.memory import PLANNED_TOKENS, RESERVE_SHARE, GpuMemory, kv_cache_bytes, read_gpu_memory

GiB = 2**30

# Published configs (the parts that size a model): Llama-3.1-8B, Llama-3.2-1B, Qwen2.5-14B.
LLAMA_8B = dict(architectures=["LlamaForCausalLM"], model_type="llama", hidden_size=4096, intermediate_size=14336,
                num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                max_position_embeddings=131072, tie_word_embeddings=False, dtype="bfloat16")
LLAMA_1B = dict(LLAMA_8B, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_key_value_heads=8,
                head_dim=64, tie_word_embeddings=True)
QWEN_14B = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=5120, intermediate_size=13824,
                num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8, vocab_size=152064,
                max_position_embeddings=32768, tie_word_embeddings=False, dtype="bfloat16")


class FakeCards:
    """Cards as torch.cuda reports them: `cards[i]` = (total, free) in bytes; `cached_free` bytes of
    torch's cached free blocks on each."""

    def __init__(self, monkeypatch, *cards: tuple[int, int], bf16: bool = True, name: str = "Fake GPU"):
        self.cards, self.bf16, self.name, self.cached_free = list(cards), bf16, name, 0
        index = lambda device=None: 0 if device is None else torch.device(device).index or 0  # noqa: E731
        for attribute, fake in {
            "is_available": lambda: True,
            "device_count": lambda: len(self.cards),
            "current_device": lambda: 0,
            "mem_get_info": lambda device=None: (self.cards[index(device)][1], self.cards[index(device)][0]),
            "is_bf16_supported": lambda *args, **kwargs: self.bf16,
            "get_device_name": lambda device=None: self.name,
            "memory_reserved": lambda device=None: self.cached_free,
            "memory_allocated": lambda device=None: 0,
            "empty_cache": lambda: None,
        }.items():
            monkeypatch.setattr(torch.cuda, attribute, fake)


@pytest.fixture
def folders(tmp_path):
    """A model folder for each config (config.json alone: the decisions read nothing else)."""
    def folder(name: str, config: dict) -> str:
        path = tmp_path / name
        path.mkdir()
        (path / "config.json").write_text(json.dumps(config))
        return str(path)
    return SimpleNamespace(llama8b=folder("Llama-3.1-8B", LLAMA_8B), llama1b=folder("Llama-3.2-1B", LLAMA_1B),
                           qwen14b=folder("Qwen2.5-14B", QWEN_14B),
                           fp32=folder("fp32-model", dict(LLAMA_1B, dtype="float32")),
                           fp16=folder("fp16-model", dict(LLAMA_1B, dtype="float16")))


@pytest.fixture(autouse=True)
def empty_cache():
    model_cache.clear()
    yield
    model_cache.clear()


# ----------------------------------------------------------------------------- dtype "auto"

def test_auto_is_float32_on_a_cpu_and_the_serving_dtype_on_a_gpu():
    for checkpoint in (None, torch.float32, torch.bfloat16, torch.float16):
        assert auto_dtype("cpu", checkpoint=checkpoint) == torch.float32        # the exact choice on CPUs
        assert auto_dtype("mps", checkpoint=checkpoint) == torch.float32
    # vLLM's rule: a half-precision checkpoint in its own dtype, a float32 or unknown one in bf16 ...
    assert auto_dtype("cuda", checkpoint=torch.bfloat16) == torch.bfloat16
    assert auto_dtype("cuda", checkpoint=torch.float16) == torch.float16
    assert auto_dtype("cuda", checkpoint=torch.float32) == torch.bfloat16
    assert auto_dtype("cuda", checkpoint=None) == torch.bfloat16
    # ... and fp16 on a card without bf16 (before Ampere).
    assert auto_dtype("cuda", checkpoint=torch.bfloat16, cuda_bf16=False) == torch.float16
    assert auto_dtype("cuda", checkpoint=torch.float32, cuda_bf16=False) == torch.float16


def test_the_checkpoint_dtype_is_read_from_the_config():
    assert checkpoint_dtype(SimpleNamespace(dtype=torch.bfloat16)) == torch.bfloat16
    assert checkpoint_dtype(SimpleNamespace(dtype="float16")) == torch.float16
    assert checkpoint_dtype(SimpleNamespace(dtype=None, torch_dtype="float32")) == torch.float32
    assert checkpoint_dtype(SimpleNamespace(dtype="int8")) is None and checkpoint_dtype(SimpleNamespace()) is None


@pytest.mark.parametrize("bf16", [True, False], ids=["bf16 card", "no bf16"])
def test_pick_dtype_on_a_faked_gpu_follows_the_checkpoint_not_the_free_memory(monkeypatch, folders, bf16):
    cards = FakeCards(monkeypatch, (80 * GiB, 80 * GiB), bf16=bf16)
    cuda = resolve_device("cuda")
    half = torch.bfloat16 if bf16 else torch.float16
    expected = {folders.llama8b: half, folders.fp32: half, folders.fp16: torch.float16}
    for free in (80 * GiB, 30 * GiB, 2 * GiB):          # the same answer however full the card is
        cards.cards[0] = (80 * GiB, free)
        for folder, dtype in expected.items():
            assert pick_dtype(folder, cuda, "auto", trust_remote_code=False) == dtype
    assert pick_dtype(folders.llama8b, cuda, "fp32", trust_remote_code=False) == torch.float32   # asked for
    # The built-in model's copy is float32 (dequantised from GGUF): served in the card's half precision.
    assert pick_dtype("SmolLM2-135M-Instruct", cuda, "auto", trust_remote_code=False) == half
    # A CPU keeps float32 whatever the checkpoint says.
    assert pick_dtype(folders.llama8b, torch.device("cpu"), "auto", trust_remote_code=False) == torch.float32


# ----------------------------------------------------------------------------- one memory budget

def test_sizes_come_from_the_config_alone(folders):
    weights, kv = estimate_bytes(folders.llama8b, torch.bfloat16, trust_remote_code=False)
    assert 16.0e9 < weights < 16.1e9                               # 8.03 B parameters in 2 bytes
    assert kv == 2 * 32 * 8 * 128 * PLANNED_TOKENS * 2 == kv_cache_bytes(
        SimpleNamespace(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096),
        torch.bfloat16)
    assert estimate_bytes(folders.llama8b, torch.float32, trust_remote_code=False)[0] == 2 * weights


@pytest.mark.parametrize("quantization, low, high", [
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 5.9e9, 6.2e9),     # 4.5 bits a weight, scales in
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 9.0e9, 9.2e9),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128}, 5.6e9, 5.9e9),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemm"}, 5.6e9, 5.9e9),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, 9.0e9, 9.2e9),
    ({"quant_method": "compressed-tensors", "config_groups": {"group_0": {"weights": {"num_bits": 8}}}}, 9.0e9, 9.2e9),
    ({"quant_method": "some-new-method"}, 16.0e9, 16.1e9),                      # not known here: the dtype's size
])
def test_a_quantized_checkpoint_is_sized_at_its_bits_per_weight(tmp_path, quantization, low, high):
    """Llama-3.1-8B's 6.98 B linear-layer weights at the checkpoint's bits; the embeddings and the output
    head (1.05 B) stay in bf16, as the quantizers leave them."""
    folder = tmp_path / "quantized"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(LLAMA_8B, quantization_config=quantization)))
    weights, _ = estimate_bytes(str(folder), torch.bfloat16, trust_remote_code=False)
    assert low < weights < high


def test_the_budget_counts_what_specviz_holds_as_its_own():
    card = GpuMemory("card", total=80 * GiB, free=40 * GiB, held=30 * GiB)   # 10 GiB held by another program
    assert card.others == 10 * GiB
    assert card.budget == int(80 * GiB * (1 - RESERVE_SHARE)) - 10 * GiB


@pytest.mark.parametrize("total, fits", [(24, True), (80, True)])
def test_an_8b_target_with_a_1b_draft_in_bf16(monkeypatch, folders, total, fits):
    FakeCards(monkeypatch, (total * GiB, total * GiB))
    fit_on_gpu([folders.llama8b, folders.llama1b], torch.device("cuda", 0), torch.bfloat16, trust_remote_code=False)


def test_a_pair_that_does_not_fit_is_refused_before_loading_with_the_sizes_and_the_ways_out(monkeypatch, folders):
    FakeCards(monkeypatch, (24 * GiB, 24 * GiB), name="Fake L4")
    cuda = torch.device("cuda", 0)
    with pytest.raises(SpecvizError) as refused:          # 8B + 1B in float32: ~37 GB
        fit_on_gpu([folders.llama8b, folders.llama1b], cuda, torch.float32, trust_remote_code=False)
    message = str(refused.value)
    assert "Llama-3.1-8B 32.1 GB + Llama-3.2-1B 4.9 GB" in message and "(Fake L4, 26 GB)" in message
    assert "dtype auto" in message and "device cpu" in message and "does not spread" in message
    with pytest.raises(SpecvizError, match="Qwen2.5-14B 29.5 GB"):          # 14B in bf16 on a 24 GB card
        fit_on_gpu([folders.qwen14b], cuda, torch.bfloat16, trust_remote_code=False)
    assert len(model_cache) == 0


def test_another_program_on_the_card_is_named(monkeypatch, folders):
    FakeCards(monkeypatch, (80 * GiB, 20 * GiB))           # 60 GiB taken by, say, a vLLM server
    with pytest.raises(SpecvizError, match="held by other programs.*stopping what else uses the card"):
        fit_on_gpu([folders.qwen14b], torch.device("cuda", 0), torch.bfloat16, trust_remote_code=False)


def test_the_same_answer_while_an_earlier_copy_is_cached_and_room_is_made_among_specvizs_own(monkeypatch, folders,
                                                                                           tmp_path):
    from specviz.models.loading import cache_key

    cards = FakeCards(monkeypatch, (24 * GiB, 24 * GiB))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(model_cache, "budget_bytes", 64 * GiB)      # SPECVIZ_MODEL_MEMORY_GB=64
    # An earlier pair's 8B target (16 GB) is cached on the card, and the driver counts it as used.
    key = cache_key(folders.llama8b, torch.bfloat16, cuda)
    model_cache.put(key, object(), 16 * 10**9)
    elsewhere = (("folder", "other", None), "bfloat16", "cuda:1")
    model_cache.put(elsewhere, object(), 10**9)
    cards.cards[0] = (24 * GiB, 24 * GiB - 16 * 10**9)
    assert read_gpu_memory(cuda).held == 16 * 10**9 and read_gpu_memory(cuda).others == 0
    # The same pair again fits, as it did the first time, and its cached target stays.
    fit_on_gpu([folders.llama8b, folders.llama1b], cuda, torch.bfloat16, trust_remote_code=False)
    assert model_cache.keys() == [key, elsewhere]
    # A 1B model fits beside it: nothing is evicted.
    fit_on_gpu([folders.llama1b], cuda, torch.bfloat16, trust_remote_code=False)
    assert model_cache.keys() == [key, elsewhere]
    # A 13 GB model fits the budget but not beside the cached 16 GB: that goes; the other card's stays.
    folder = tmp_path / "Llama-24-layers"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(dict(LLAMA_8B, num_hidden_layers=24)))
    fit_on_gpu([str(folder)], cuda, torch.bfloat16, trust_remote_code=False)
    assert model_cache.keys() == [elsewhere]


# ----------------------------------------------------------------------------- devices

def test_one_and_two_cards(monkeypatch, folders):
    cards = FakeCards(monkeypatch, (80 * GiB, 80 * GiB))
    assert resolve_device("auto") == torch.device("cuda", 0) == resolve_device("cuda")
    with pytest.raises(SpecvizError, match="only 1 GPU"):
        resolve_device("cuda:1")
    cards.cards.append((24 * GiB, 4 * GiB))            # a second, smaller and busy card
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert read_gpu_memory(torch.device("cuda", 1)).total == 24 * GiB
    fit_on_gpu([folders.llama8b], torch.device("cuda", 0), torch.bfloat16, trust_remote_code=False)
    with pytest.raises(SpecvizError, match="cuda:1"):  # the budget is the named card's
        fit_on_gpu([folders.llama8b], torch.device("cuda", 1), torch.bfloat16, trust_remote_code=False)


def test_the_command_line_says_it_in_one_line_before_loading(monkeypatch, folders, capsys):
    from specviz.cli import entry

    FakeCards(monkeypatch, (24 * GiB, 24 * GiB), name="Fake L4")
    code = entry(["run", "--target", folders.qwen14b, "--device", "cuda", "--raw", "Hello"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and out == ""
    assert lines[-1].startswith("error: Does not fit cuda:0 (Fake L4, 26 GB)") and "Qwen2.5-14B 29.5 GB" in lines[-1]
