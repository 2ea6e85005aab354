"""The serving engines on GPUs this machine does not have: the decisions (`engines.gpu`) against faked
cards, and the servers' commands and variables with torch's view of CUDA and its caching allocator faked
(tests/fake_cuda.py: the own models' memory is given back only when nothing references them and the
cache is emptied) and a stand-in for vLLM's server that records how it was started. specviz's own code
runs as it is, its model cache included."""

import json
import sys
import time
from pathlib import Path

import pytest

from fake_cuda import FakeCuda
from specviz.catalog import BenchPrompt
from specviz.engines import VllmEngine, VllmInstall, engine_configs, gpu
from specviz.engines.llamacpp import LlamaCppEngine, LlamaCppInstall, parse_device_list
from specviz.errors import SpecvizError
from specviz.models.cache import model_cache
from specviz.runs.engine_load import engine_sweep
from specviz.settings import RunSettings, parse_draft

ROOT = Path(__file__).resolve().parent.parent
GIB = 1 << 30
CARD_24, CARD_80 = 24 * GIB, 80 * GIB


# ----------------------------------------------------------------------------- the decisions

@pytest.mark.parametrize("total, free, share", [
    (CARD_80, CARD_80, 0.9),                 # a card to itself: vLLM's own default, never more
    (CARD_80, 50 * GIB, 0.61),               # 30 GiB held by another program: (50 - 1) / 80, rounded down
    (CARD_24, 23 * GIB, 0.9),                # (23 - 1) / 24 = 0.916 -> at most 0.9
    (CARD_24, 12 * GIB, 0.45),               # (12 - 1) / 24 = 0.458
])
def test_the_memory_share_is_what_is_free_less_a_margin_at_most_vllms_default(total, free, share):
    assert gpu.memory_utilization(free, total) == share
    assert share * total <= free - gpu.MARGIN + 0.01 * total     # vLLM starts only if free >= share x total
    assert gpu.vllm_gpu_args(gpu.Gpu(0, free, total, 1), []) == ["--gpu-memory-utilization", f"{share:.2f}"]


def test_too_little_free_memory_is_a_clear_error_and_a_given_share_is_the_users():
    with pytest.raises(SpecvizError, match=r"Only 2\.5 GiB of the GPU's 24\.0 GiB are free.*--device cuda:N.*"
                                           r"--gpu-memory-utilization"):
        gpu.memory_utilization(int(2.5 * GIB), CARD_24)
    for given in (["--gpu-memory-utilization=0.5"], ["--gpu-memory-utilization", "0.5"]):
        assert gpu.vllm_gpu_args(gpu.Gpu(0, int(2.5 * GIB), CARD_24, 1), given) == []
    assert gpu.vllm_gpu_args(gpu.Gpu(0, None, None, None), []) == []    # specviz's torch sees no CUDA: vLLM's default
    assert gpu.vllm_gpu_args(None, []) == []                             # a CPU: nothing


@pytest.mark.parametrize("device, count, parent, pinned", [
    ("auto", 1, None, None), ("cuda", 2, None, None),                # no index: the server sees what specviz sees
    ("cuda:0", 1, None, "0"), ("cuda:1", 2, None, "1"),
    ("cuda:1", 2, "2,3", "3"),                                       # specviz's cuda:1 is the machine's GPU 3
])
def test_cuda_n_pins_the_server_to_that_gpu(device, count, parent, pinned):
    facts = gpu.Gpu(gpu.device_index(device), CARD_80, CARD_80, count)
    env = gpu.server_env(facts, [], {"CUDA_VISIBLE_DEVICES": parent} if parent else {})
    assert env == ({"CUDA_VISIBLE_DEVICES": pinned} if pinned else {})


def test_a_pin_refuses_a_gpu_that_is_not_there_and_parallelism_over_several():
    with pytest.raises(SpecvizError, match="only 1 GPU"):
        gpu.server_env(gpu.Gpu(1, CARD_24, CARD_24, 1), [], {})
    with pytest.raises(SpecvizError, match="pins the server to one GPU"):
        gpu.server_env(gpu.Gpu(1, CARD_80, CARD_80, 2), ["--tensor-parallel-size=2"], {})
    assert gpu.server_env(gpu.Gpu(None, CARD_80, CARD_80, 2), ["--tensor-parallel-size=2"], {}) == {}


@pytest.mark.parametrize("args", [["-tp=2"], ["-tp", "2"], ["-pp=2"], ["--dtype", "auto", "-pp", "4"],
                                  ["--pipeline-parallel-size", "2"]])
def test_vllms_short_parallelism_flags_are_read_as_the_long_ones(args):
    with pytest.raises(SpecvizError, match="pins the server to one GPU"):
        gpu.server_env(gpu.Gpu(1, CARD_80, CARD_80, 2), args, {})
    assert gpu.server_env(gpu.Gpu(1, CARD_80, CARD_80, 2), ["-tp=1"], {}) == {"CUDA_VISIBLE_DEVICES": "1"}


# ----------------------------------------------------------------------------- faked CUDA

def test_read_gpu_reads_the_device_asked_for(monkeypatch):
    cuda = FakeCuda(monkeypatch, (CARD_80, 10 * GIB), (CARD_80, 10 * GIB))
    assert gpu.read_gpu("cuda:1") == gpu.Gpu(1, 70 * GIB, CARD_80, 2) and cuda.asked == [1]
    assert gpu.read_gpu("auto") == gpu.Gpu(None, 70 * GIB, CARD_80, 2) and cuda.asked[-1] == 0
    with pytest.raises(SpecvizError, match="only 2 GPU"):
        gpu.read_gpu("cuda:2")


def standin_python(tmp_path, monkeypatch) -> tuple[Path, Path]:
    """A 'python' that runs tests/standin_vllm_server.py for `-m vllm.entrypoints.openai.api_server`."""
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} {ROOT / 'tests' / 'standin_vllm_server.py'} \"$@\"\n")
    python.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("STANDIN_RECORD", str(record))
    return python, record


# Each case starts two stand-in servers (~2 s): one in the quick loop, all four in CI.
@pytest.mark.parametrize("in_use", [False, pytest.param(True, marks=pytest.mark.slow)],
                         ids=["own models let go", "own model still in use"])
@pytest.mark.parametrize("total, count, device", [(CARD_24, 1, "auto"),
                                                  pytest.param(CARD_80, 2, "cuda:1", marks=pytest.mark.slow)])
def test_a_vllm_server_on_a_gpu_frees_the_own_models_takes_what_is_free_and_is_pinned(tmp_path, monkeypatch,
                                                                                       total, count, device, in_use):
    cuda = FakeCuda(monkeypatch, *[(total, 2 * GIB)] * count)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    index = 1 if device == "cuda:1" else 0
    card = cuda.cards[index]
    # The own loop's last pair, still cached (6 GiB on the card); with `in_use` something else (a run
    # in another session) still holds 4 GiB of it, which letting go of the cache cannot free.
    pair = [cuda.allocate(2 * GIB, index), cuda.allocate(4 * GIB, index)]
    model_cache.put(("own", "pair"), pair, 6 * GIB)
    held_elsewhere = pair[1] if in_use else None
    del pair
    python, record = standin_python(tmp_path, monkeypatch)
    install = VllmInstall(str(python), "0.32.0", "cuda", "Fake GPU", count, "2.13.0")
    # As the Load tab's "all three" makes it: the own loop's float32 for a CPU, vLLM's own dtype on a GPU.
    engine = VllmEngine(model="/models/target", dtype="float32", gpu_dtype="auto", install=install,
                        requested_device=device, log_dir=tmp_path / "logs")
    prompts = [BenchPrompt("p0", "rewrite", "Rewrite this.")]
    settings = RunSettings(draft="ngram", k=4, max_new_tokens=4, dtype="float32", device=device)
    *_, last = engine_sweep(settings, prompts, engine, engine_configs(parse_draft("ngram"), [0, 4]), batches=[1],
                            ks=[0, 4], warm_up=False)

    # Let go before the first server started: what nothing else holds went back to the driver.
    still = 4 * GIB if in_use else 0
    assert len(model_cache) == 0 and card.reserved == card.allocated == still
    starts = [e for e in map(json.loads, record.read_text().splitlines()) if e["event"] == "start"]
    share = f"{gpu.memory_utilization(total - 2 * GIB - still, total):.2f}"     # what is free once the own models went
    assert len(starts) == 2
    for start in starts:
        argv = start["argv"]
        assert argv[argv.index("--gpu-memory-utilization") + 1] == share
        assert argv[argv.index("--dtype") + 1] == "auto"
        assert start["cuda_visible_devices"] == ("1" if device == "cuda:1" else None)
    described = last.result.engine
    assert described["dtype"] == "auto" and described["gpu"]["requested_device"] == device
    assert described["gpu"]["servers"]["plain"]["args"] == ["--gpu-memory-utilization", share]
    del held_elsewhere


def test_on_a_cpu_the_vllm_command_and_record_are_as_before(tmp_path):
    install = VllmInstall("/venv/bin/python", "0.32.0", "cpu")
    engine = VllmEngine(model="/m", dtype="float32", gpu_dtype="auto", install=install)
    model_cache.put(("own", "cpu pair"), object(), 1)
    assert engine.placement() == ([], {}) and len(model_cache) == 1      # nothing let go, nothing read
    model_cache.clear()
    assert engine.serving_dtype == "float32" and "gpu" not in engine.describe([])


# ----------------------------------------------------------------------------- llama.cpp

CPU_DEVICES = ({"name": "CPU", "description": "AMD EPYC", "type": "CPU", "memory_total": 24 * GIB},)
GPU_DEVICES = CPU_DEVICES + tuple({"name": f"CUDA{i}", "description": "NVIDIA H100 80GB HBM3", "type": "GPU",
                                   "memory_total": CARD_80} for i in range(2))


def test_llamacpp_on_a_gpu_build_offloads_every_layer_and_says_where_it_ran():
    cpu = LlamaCppEngine(model="/m.gguf", threads=2, install=LlamaCppInstall(("x",), "2026.10", "xllamacpp",
                                                                             devices=CPU_DEVICES))
    assert cpu.device == "cpu" and "--n-gpu-layers" not in cpu.server_flags()
    assert cpu.server_flags() == ["--model", "/m.gguf", "--alias", "specviz-target", "--threads", "2", "--parallel",
                                  "1", "--ctx-size", "1024", "--cont-batching", "--no-cache-prompt", "--metrics"]
    assert cpu.environment()["device"] == "cpu" and "device_count" not in cpu.environment()

    cuda = LlamaCppEngine(model="/m.gguf", threads=2, install=LlamaCppInstall(("x",), "2026.10", "xllamacpp",
                                                                              devices=GPU_DEVICES))
    flags = cuda.server_flags()
    assert flags[flags.index("--n-gpu-layers") + 1] == gpu.GPU_LAYERS_ALL
    env = cuda.environment()
    assert (env["device"], env["device_name"], env["device_count"]) == ("cuda", "NVIDIA H100 80GB HBM3", 2)
    assert cuda.device == "cuda"
    mine = LlamaCppEngine(model="/m.gguf", install=cuda.install, engine_args=["--n-gpu-layers", "20"])
    assert mine.server_flags().count("--n-gpu-layers") == 1          # the user's own count stays


def test_a_llama_server_binarys_device_list_is_read():
    text = ("ggml_cuda_init: found 2 CUDA devices:\nAvailable devices:\n"
            "  CUDA0: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB free)\n"
            "  CUDA1: NVIDIA GeForce RTX 4090 (24080 MiB, 24000 MiB free)\n")
    listed = parse_device_list(text)
    assert [d["name"] for d in listed] == ["CUDA0", "CUDA1"] and listed[0]["memory_total"] == 24080 << 20
    assert LlamaCppInstall(("llama-server",), "b1", "llama-server", devices=tuple(listed)).device == "cuda"
    assert parse_device_list("Available devices:\n") == []           # a CPU build lists none


def test_xllamacpp_takes_the_gpu_layers_flag():
    pytest.importorskip("xllamacpp")
    from specviz.engines.llamacpp_server import params_from

    assert params_from(["--n-gpu-layers", gpu.GPU_LAYERS_ALL]).n_gpu_layers == 999


def test_a_llamacpp_server_on_a_gpu_is_pinned_and_the_own_models_let_go(tmp_path, monkeypatch):
    cuda = FakeCuda(monkeypatch, (CARD_80, 0), (CARD_80, 0))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    seen = tmp_path / "seen"
    server = tmp_path / "llama-server"      # records its variable and flags, then serves nothing
    server.write_text(f"#!/bin/sh\necho \"$CUDA_VISIBLE_DEVICES $*\" > {seen}\nsleep 30\n")
    server.chmod(0o755)
    model_cache.put(("own", "pair"), cuda.allocate(3 * GIB, device=1), 3 * GIB)
    engine = LlamaCppEngine(model="/m.gguf", threads=2, requested_device="cuda:1", log_dir=tmp_path,
                            install=LlamaCppInstall((str(server),), "b1", "llama-server", devices=GPU_DEVICES[1:]))
    handle = engine.start(engine_configs(parse_draft("ngram"), [0])[0])
    try:
        for _ in range(100):
            if seen.exists() and seen.read_text().strip():
                break
            time.sleep(0.05)
        pinned, *flags = seen.read_text().split()
    finally:
        handle.stop()
    assert pinned == "1" and flags[flags.index("--n-gpu-layers") + 1] == "999" and len(model_cache) == 0
    assert cuda.cards[1].reserved == 0                  # given back to the driver before the server started
