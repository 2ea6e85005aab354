"""The GPU decisions (dtype "auto", the memory budget, devices) on this CPU against faked CUDA cards.

What is faked is the hardware and torch's caching allocator (tests/fake_cuda.py): torch.cuda's answers
about a card (present, how many, its total and free memory, bf16 support, its name, what this process
reserved and allocated), and models "loaded" as objects holding bytes on a card, freed only when
nothing references them and returned to the driver only by empty_cache. specviz's own code runs as it
would on the card; nothing here allocates on a GPU. The configs are real model configs (their
sizes as published), so the figures are the ones a user of these models would meet."""

import gc
import json
from types import SimpleNamespace

import pytest
import torch

from fake_cuda import FakeCuda
from specviz.errors import SpecvizError
from specviz.models import auto_dtype, checkpoint_dtype, resolve_device
from specviz.models.cache import model_cache
from specviz.models.loading import cache_key, estimate_bytes, fit_on_gpu, pick_dtype
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
    cards = FakeCuda(monkeypatch, (80 * GiB, 0), bf16=bf16)
    cuda = resolve_device("cuda")
    half = torch.bfloat16 if bf16 else torch.float16
    expected = {folders.llama8b: half, folders.fp32: half, folders.fp16: torch.float16}
    for free in (80 * GiB, 30 * GiB, 2 * GiB):          # the same answer however full the card is
        cards.cards[0].other = 80 * GiB - free
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
    FakeCuda(monkeypatch, (total * GiB, 0))
    fit_on_gpu([folders.llama8b, folders.llama1b], torch.device("cuda", 0), torch.bfloat16, trust_remote_code=False)


def test_a_pair_that_does_not_fit_is_refused_before_loading_with_the_sizes_and_the_ways_out(monkeypatch, folders):
    FakeCuda(monkeypatch, (24 * GiB, 0), name="Fake L4")
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
    FakeCuda(monkeypatch, (80 * GiB, 60 * GiB))            # 60 GiB taken by, say, a vLLM server
    with pytest.raises(SpecvizError, match="held by other programs.*stopping what else uses the card"):
        fit_on_gpu([folders.qwen14b], torch.device("cuda", 0), torch.bfloat16, trust_remote_code=False)


def test_the_same_answer_while_an_earlier_copy_is_cached_and_room_is_made_among_specvizs_own(monkeypatch, folders,
                                                                                           tmp_path):
    cards = FakeCuda(monkeypatch, (24 * GiB, 0), (24 * GiB, 0))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(model_cache, "budget_bytes", 64 * GiB)      # SPECVIZ_MODEL_MEMORY_GB=64
    # An earlier pair's 8B target (16 GB) is cached on the card, and the driver counts it as used; only
    # the cache holds it.
    key = cache_key(folders.llama8b, torch.bfloat16, cuda)
    model_cache.put(key, cards.allocate(16 * 10**9), 16 * 10**9)
    elsewhere = (("folder", "other", None), "bfloat16", "cuda:1")
    model_cache.put(elsewhere, cards.allocate(10**9, device=1), 10**9)
    assert cards.cards[0].free == 24 * GiB - 16 * 10**9
    assert read_gpu_memory(cuda).held == 16 * 10**9 and read_gpu_memory(cuda).others == 0
    # The same pair again fits, as it did the first time, and its cached target stays.
    fit_on_gpu([folders.llama8b, folders.llama1b], cuda, torch.bfloat16, trust_remote_code=False)
    assert model_cache.keys() == [key, elsewhere]
    # A 1B model fits beside it: nothing is evicted.
    fit_on_gpu([folders.llama1b], cuda, torch.bfloat16, trust_remote_code=False)
    assert model_cache.keys() == [key, elsewhere] and cards.cards[0].allocated == 16 * 10**9
    # A 13 GB model fits the budget but not beside the cached 16 GB: that goes, and its memory with it
    # (collected, and the allocator's cache emptied); the other card's stays.
    fit_on_gpu([llama_24_layers(tmp_path)], cuda, torch.bfloat16, trust_remote_code=False)
    assert model_cache.keys() == [elsewhere]
    assert cards.cards[0].free == 24 * GiB and cards.cards[1].allocated == 10**9


def llama_24_layers(tmp_path) -> str:
    """A ~13 GB model in bf16 (Llama-3.1-8B's shape with 24 layers): fits a 24 GiB card alone, not beside 16 GB."""
    folder = tmp_path / "Llama-24-layers"
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(dict(LLAMA_8B, num_hidden_layers=24)))
    return str(folder)


def test_a_cached_model_still_in_use_elsewhere_is_not_room(monkeypatch, folders, tmp_path):
    # An earlier pair's 8B target is cached, and a run in another session still decodes with it: evicting
    # it from the cache frees nothing, however often the allocator's cache is emptied.
    cards = FakeCuda(monkeypatch, (24 * GiB, 0))
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(model_cache, "budget_bytes", 64 * GiB)
    in_use = cards.allocate(16 * 10**9)
    model_cache.put(cache_key(folders.llama8b, torch.bfloat16, cuda), in_use, 16 * 10**9)
    with pytest.raises(SpecvizError, match=r"Does not fit cuda:0 \(Fake GPU\) yet.*16\.0 GB of them are still in "
                                           r"use.*Nothing was loaded; try again when that run has finished"):
        fit_on_gpu([llama_24_layers(tmp_path)], cuda, torch.bfloat16, trust_remote_code=False)
    assert cards.emptied and cards.cards[0].allocated == cards.cards[0].reserved == 16 * 10**9
    assert len(model_cache) == 0                      # evicted all the same: it goes when the run lets go
    # Had the load gone ahead, the allocator would have run out of memory.
    with pytest.raises(torch.OutOfMemoryError):
        cards.allocate(13 * 10**9)
    # The run ends and lets go (not yet collected: a model's modules refer to each other): the same load
    # fits, with the card's memory back.
    del in_use
    fit_on_gpu([llama_24_layers(tmp_path)], cuda, torch.bfloat16, trust_remote_code=False)
    assert cards.cards[0].allocated == 0 and cards.allocate(13 * 10**9)


def test_torchs_cached_free_blocks_count_as_room_and_live_tensors_do_not(monkeypatch):
    cards = FakeCuda(monkeypatch, (24 * GiB, 2 * GiB))
    cuda = torch.device("cuda", 0)
    cached = cards.allocate(6 * GiB)
    live = cards.allocate(4 * GiB)           # tensors of a run, never in the model cache
    del cached
    gc.collect()                             # freed: its blocks stay reserved until empty_cache
    card = read_gpu_memory(cuda)
    assert (card.free, card.held, card.others) == (12 * GiB, 6 * GiB, 6 * GiB)    # the live 4 GiB count as others'
    torch.cuda.empty_cache()
    assert read_gpu_memory(cuda) == type(card)(card.name, 24 * GiB, 18 * GiB, 0) and live.nbytes == 4 * GiB


# ----------------------------------------------------------------------------- devices

def test_one_and_two_cards(monkeypatch, folders):
    cards = FakeCuda(monkeypatch, (80 * GiB, 0))
    assert resolve_device("auto") == torch.device("cuda", 0) == resolve_device("cuda")
    with pytest.raises(SpecvizError, match="only 1 GPU"):
        resolve_device("cuda:1")
    cards.add(24 * GiB, 20 * GiB)                      # a second, smaller and busy card
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    assert read_gpu_memory(torch.device("cuda", 1)).total == 24 * GiB
    fit_on_gpu([folders.llama8b], torch.device("cuda", 0), torch.bfloat16, trust_remote_code=False)
    with pytest.raises(SpecvizError, match="cuda:1"):  # the budget is the named card's
        fit_on_gpu([folders.llama8b], torch.device("cuda", 1), torch.bfloat16, trust_remote_code=False)


def test_the_command_line_says_it_in_one_line_before_loading(monkeypatch, folders, capsys):
    from specviz.cli import entry

    FakeCuda(monkeypatch, (24 * GiB, 0), name="Fake L4")
    code = entry(["run", "--target", folders.qwen14b, "--device", "cuda", "--raw", "Hello"])
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2 and "Traceback" not in err and out == ""
    assert lines[-1].startswith("error: Does not fit cuda:0 (Fake L4, 26 GB)") and "Qwen2.5-14B 29.5 GB" in lines[-1]
