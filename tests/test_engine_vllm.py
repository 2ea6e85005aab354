"""vLLM as the engine (specviz.engines, runs.engine_load, runs.engine_compare, `--engine vllm`).

The fast tests check the mapping of drafters and dtypes to vLLM's configs and flags, the messages for
a missing or old vLLM, the watchdog on a stand-in process tree, and the sweep for device="cuda"
(which this machine lacks) against a stand-in server started as vLLM would be
(tests/standin_vllm_server.py): the commands, one server at a time, the requests per point. The slow
ones start vLLM's CPU server on the built-in model (real servers, no mocks): two servers (plain and
ngram k = 4, fp32) shared by the module, plus the servers the commands under test start themselves.
They need vLLM's environment (`bash scripts/make_vllm_env.sh`, SPECVIZ_VLLM_PYTHON): without it they
skip, except in CI (CI set), where .ci/run builds it and a missing vLLM fails.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import default_sigint, wait_or_kill

from specviz.engines import configs as engine_configs_module
from specviz.engines.configs import (EngineConfig, engine_configs, per_batch_schedule, recommended_config,
                                     speculative_config)
from specviz.errors import SpecvizError
from specviz.metrics import acceptance_rate_per_position
from specviz.runs.engine_load import first_differing_word
from specviz.settings import parse_draft

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Rewrite more formally: hey, the meeting moved to friday, tell the others and bring the slides.",
           "Fix the spelling: Teh quick brown fox jumpd over teh lazy dog and ran awya from teh farmer.",
           "Rewrite in the past tense: I walk to the station, I buy a ticket and I wait for the train.",
           "Make this polite: send me the report now, I need the numbers for the meeting."]
NEW_TOKENS = 24

NGRAM = parse_draft("ngram")       # parsed once, at the edge, as the command line and the app do


def env(**extra) -> dict:
    out = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    out.update(extra)
    return out


def specviz(*args, timeout=600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env(), timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


# ----------------------------------------------------------------------------- no vLLM needed

def test_the_engine_path_parses_the_draft_once_at_the_edge(monkeypatch):
    # `load --engine vllm|llamacpp` parses --draft once (settings_from) and hands the DraftSpec down: from
    # there to the servers' configs nothing parses it again.
    import argparse

    from specviz import settings as settings_module
    from specviz.cli.engine import engine_draft_configs
    from specviz.engines import llamacpp

    from specviz.cli import engine as cli_engine
    from specviz.engines import configs

    spec = parse_draft("ngram")
    calls = []
    # Wherever the engine path could call it from (before: engines.configs, engines.llamacpp, cli.engine).
    for module in (settings_module, configs, llamacpp, cli_engine):
        monkeypatch.setattr(module, "parse_draft", lambda text: calls.append(text), raising=False)
    for engine in ("vllm", "llamacpp"):
        args = argparse.Namespace(engine=engine, speculative_config=None)
        configs = engine_draft_configs(args, spec, [0, 2, 4])
        assert [c.k for c in configs] == [0, 2, 4] and all(c.speculative_config for c in configs[1:])
    assert llamacpp.engine_configs(spec, [4])[1].speculative_config["draft_n_max"] == 4
    assert calls == []


def test_drafters_map_to_vllm_configs(monkeypatch, tmp_path):
    assert speculative_config(NGRAM, 0) is None
    assert speculative_config(NGRAM, 4) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                              "prompt_lookup_max": 3}
    folder = str(ROOT / "assets")
    monkeypatch.setattr(engine_configs_module, "model_location", lambda spec, progress=None: f"/m/{spec}")
    assert speculative_config(parse_draft(folder), 2) == {"method": "draft_model", "model": f"/m/{folder}",
                                             "num_speculative_tokens": 2}
    given = {"method": "eagle3", "model": "org/eagle", "num_speculative_tokens": 9}
    assert speculative_config(NGRAM, 3, given) == dict(given, num_speculative_tokens=3)
    with pytest.raises(SpecvizError, match="no drafter like 'self:8'"):
        speculative_config(parse_draft("self:8"), 4)
    # A draft head: vLLM's eagle3 with the head's folder (speculators format); a first specviz head
    # (head.json, EAGLE-1 shaped, such as the shipped one until it is retrained) is refused with why.
    head = tmp_path / "head"
    head.mkdir()
    (head / "config.json").write_text("{}")
    assert speculative_config(parse_draft(f"head:{head}"), 3) == {"method": "eagle3", "model": str(head.resolve()),
                                                     "num_speculative_tokens": 3}
    assert speculative_config(parse_draft("head:org/eagle3-head"), 2)["model"] == "org/eagle3-head"   # a hub id
    (head / "config.json").unlink()
    (head / "head.json").write_text("{}")
    with pytest.raises(SpecvizError, match="vLLM serves heads in the speculators format"):
        speculative_config(parse_draft(f"head:{head}"), 3)
    configs = engine_configs(NGRAM, [0, 2, 4])
    assert [c.k for c in configs] == [0, 2, 4] and configs[0].speculative_config is None
    assert [c.label for c in configs] == ["plain", "ngram k=2", "ngram k=4"]


def test_the_bare_head_is_served_only_for_the_built_in_target_it_ships_for(tmp_path):
    # 'head' alone is the head shipped for the built-in target: with another --target vLLM would serve it
    # a head trained on another model. The built-in by its name, hub id or converted copy gets it.
    import argparse

    from specviz.cli.engine import engine_draft_configs
    from specviz.models.head_files import SHIPPED_HEADS
    from specviz.models.sources import cache_folder

    head = parse_draft("head")
    shipped = str(SHIPPED_HEADS / "SmolLM2-135M-Instruct")
    for target in (None, "SmolLM2-135M-Instruct", "HuggingFaceTB/SmolLM2-135M-Instruct",
                   str(cache_folder() / "models" / "SmolLM2-135M-Instruct")):
        assert speculative_config(head, 3, target=target)["model"] == shipped, target
    for target in ("HuggingFaceTB/SmolLM2-360M-Instruct", str(tmp_path)):
        with pytest.raises(SpecvizError, match=f"shipped for the built-in SmolLM2-135M-Instruct, and the target is "
                                               f"{target}.*head:DIR"):
            speculative_config(head, 3, target=target)
    with pytest.raises(SpecvizError, match="No draft head ships for gemma-3-270m"):
        speculative_config(head, 3, target="gemma-3-270m")
    # The command line passes --target down (load and compare --engine vllm).
    args = argparse.Namespace(engine="vllm", speculative_config=None)
    with pytest.raises(SpecvizError, match="and the target is org/other"):
        engine_draft_configs(args, head, [0, 3], "org/other")
    assert engine_draft_configs(args, head, [0, 3], None)[1].speculative_config["model"] == shipped
    (tmp_path / "config.json").write_text("{}")       # 'head:DIR' names its head: any target
    assert speculative_config(parse_draft(f"head:{tmp_path}"), 3, target="org/other")["model"] == str(tmp_path)


@pytest.mark.parametrize("given, expected", [("bf16", "bfloat16"), ("fp32", "float32"), ("fp16", "float16"),
                                             ("half", "float16"), ("float32", "float32"), ("auto", "auto")])
def test_specviz_dtype_names_reach_vllm_in_its_spelling(given, expected):
    from specviz.engines.vllm_install import VllmInstall
    from specviz.engines.vllm_server import server_command

    command = server_command(VllmInstall("/venv/bin/python", "0.32.0", "cpu"), "/m", 8000, dtype=given,
                             speculative_config=None)
    assert command[command.index("--dtype") + 1] == expected      # vLLM's --dtype refuses "bf16" and "fp32"


def test_an_unknown_dtype_is_a_message():
    from specviz.engines import vllm_dtype

    with pytest.raises(SpecvizError, match="Unknown dtype 'int3'"):
        vllm_dtype("int3")


def test_a_gpu_server_never_gets_the_cpu_defaults():
    from specviz.engines.vllm_install import VllmInstall
    from specviz.engines.vllm_server import server_command
    from specviz.ui.load_engine import operator_args

    def command(device, engine_args=()):
        return server_command(VllmInstall("/venv/bin/python", "0.32.0", device), "/m", 8000, dtype="bf16",
                              speculative_config=speculative_config(NGRAM, 4), engine_args=engine_args)

    gpu = command("cuda", ["--tensor-parallel-size=2"])
    assert "--enforce-eager" not in gpu and "--max-model-len" not in gpu and "--tensor-parallel-size=2" in gpu
    cpu = command("cpu")
    assert cpu[-3:] == ["--enforce-eager", "--max-model-len", "1024"]
    # the user's own value wins, given either way
    assert command("cpu", ["--max-model-len=4096"]).count("--max-model-len") == 0
    assert "--enforce-eager" not in command("cpu", ["--no-enforce-eager"])
    # the app adds nothing of its own for the operator: the device decides
    assert operator_args() == []


def test_an_old_vllm_is_refused_by_name():
    from specviz.engines.vllm_install import check_features

    check_features("0.32.0", [], "/venv/bin/python")
    with pytest.raises(SpecvizError, match="vLLM 0.27.1 at /venv/bin/python is too old.*per-request-spec-decode"):
        check_features("0.27.1", ["per_request_spec_decode_metrics"], "/venv/bin/python")


def test_a_point_holds_several_waves_of_requests():
    from specviz.runs.engine_load import requests_per_point

    for batch in (1, 2, 4, 8, 16):
        # four rewrite prompts: every stream sends at least four requests (one wave is B requests)
        assert requests_per_point(batch, 4) >= 4 * batch
    assert requests_per_point(1, 4) == 4 and requests_per_point(2, 4, repeats=2) == 16


def test_each_point_on_vllm_has_its_own_prefix_cache_namespace():
    # vLLM caches prompt blocks by default: a point must not reuse the warm-up's or an earlier point's.
    from types import SimpleNamespace

    from specviz.catalog import BenchPrompt
    from specviz.runs.engine_load import make_requests, point_salt
    from specviz.settings import RunSettings

    vllm, llamacpp = SimpleNamespace(name="vllm"), SimpleNamespace(name="llamacpp")
    salts = {point_salt(vllm, EngineConfig(k, None), batch) for k in (0, 4) for batch in (1, 4)}
    assert len(salts) == 4 and None not in salts
    assert point_salt(vllm, EngineConfig(4, None), 1) != point_salt(vllm, EngineConfig(4, None), 1)   # a rerun too
    assert point_salt(llamacpp, EngineConfig(4, None), 1) is None
    prompts = [BenchPrompt("a", "edit", "Fix: teh cat"), BenchPrompt("b", "edit", "Fix: a dgo")]
    salt = point_salt(vllm, EngineConfig(4, None), 1)
    bodies = [r.body("m") for r in make_requests(RunSettings(), prompts, 4, cache_salt=salt)]
    assert {b["cache_salt"] for b in bodies} == {salt}     # shared inside the point, as vllm bench serve's requests
    assert "cache_salt" not in make_requests(RunSettings(), prompts, 1)[0].body("m")


def _responses(ttft: float, seconds: float, tokens: int = 48, count: int = 4) -> list:
    """One request at a time, each `seconds` long, its first token after `ttft`, jittered a little per request."""
    from specviz.engines import Response

    out, clock = [], 0.0
    for i in range(count):
        jitter = 0.01 * i
        out.append(Response(i, text=f"answer {i}", tokens=tokens, sent=clock, first=clock + ttft + jitter,
                            finished=clock + seconds + jitter, spec={"num_spec_steps": 20, "num_draft_tokens": 80,
                                                                     "num_accepted_draft_tokens": 27,
                                                                     "acceptance_histogram": [5, 5, 5, 5, 0]}))
        clock += seconds + jitter
    return out


def test_the_recommended_config_follows_the_named_metric():
    from specviz.catalog import BenchPrompt
    from specviz.runs.engine_load import DECISION_METRICS, EngineLoadResult, engine_point
    from specviz.views.load_view import decision, speedup_figure

    prompts = [BenchPrompt(f"p{i}", "rewrite", f"prompt {i}") for i in range(4)]
    plain = _responses(ttft=0.1, seconds=1.0)
    # speculation writes each token faster (TPOT 0.5 s / 47 against 0.9 s / 47) but starts later: slower overall
    spec = _responses(ttft=0.6, seconds=1.1)
    configs = engine_configs(NGRAM, [0, 4])
    recommended = {}
    for metric in DECISION_METRICS:
        points = [engine_point(1, k, spec if k else plain, plain, prompts, greedy=False, metric=metric)
                  for k in (0, 4)]
        named = {"decision_metric": metric, "decision_metric_text": DECISION_METRICS[metric]}
        result = EngineLoadResult(settings=named, environment={}, points=points, configs=configs)
        recommended[metric] = result.recommended_speculative_config
        sentence = decision(result)
        assert sentence.startswith(f"By {DECISION_METRICS[metric]}"), sentence
        assert DECISION_METRICS[metric].split(" (")[0] in speedup_figure(result).layout.title.text
        spec_point = points[1]
        assert spec_point.throughput_ratio == pytest.approx(1.0 / 1.1, rel=0.02)
        assert spec_point.tpot_ratio == pytest.approx(0.9 / 0.5, rel=0.02)
    assert recommended["throughput"] is None                          # fewer tokens per second: off
    assert recommended["tpot"] == configs[1].speculative_config       # less time per token: k = 4


def test_the_sweep_for_a_gpu_runs_one_server_at_a_time_with_gpu_commands(tmp_path, monkeypatch):
    from specviz.catalog import BenchPrompt
    from specviz.engines import VllmEngine, VllmInstall
    from specviz.runs.engine_load import WAVES, engine_sweep
    from specviz.settings import RunSettings

    python = tmp_path / "python"      # "PYTHON -m vllm.entrypoints.openai.api_server ARGS" runs the stand-in
    python.write_text(f"#!/bin/sh\nshift 2\nexec {sys.executable} {ROOT / 'tests' / 'standin_vllm_server.py'} \"$@\"\n")
    python.chmod(0o755)
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("STANDIN_RECORD", str(record))
    install = VllmInstall(str(python), "0.32.0", "cuda", "Stand-in GPU", 2, "2.13.0")
    engine = VllmEngine(model="/models/target", dtype="bf16", engine_args=["--tensor-parallel-size=2"],
                        install=install, log_dir=tmp_path / "logs")
    prompts = [BenchPrompt(f"p{i}", "rewrite", f"Rewrite this, number {i}.") for i in range(4)]
    settings = RunSettings(draft="ngram", k=4, max_new_tokens=8, dtype="bf16")
    configs = engine_configs(NGRAM, [0, 4])
    *_, last = engine_sweep(settings, prompts, engine, configs, batches=[1, 4], ks=[0, 4])
    result = last.result

    events = [json.loads(line) for line in record.read_text().splitlines()]
    starts = [e for e in events if e["event"] == "start"]
    assert len(starts) == 2
    for start in starts:
        argv = start["argv"]
        assert "--enforce-eager" not in argv and "--max-model-len" not in argv     # no CPU defaults on a GPU
        assert argv[argv.index("--dtype") + 1] == "bfloat16" and "--tensor-parallel-size=2" in argv
    # one server at a time: the first stopped before the second started (no memory shares needed)
    (first_stop,) = [e["t"] for e in events if e["event"] == "stop" and e["pid"] == starts[0]["pid"]]
    assert first_stop <= starts[1]["t"]
    assert "--speculative-config" not in starts[0]["argv"] and "--speculative-config" in starts[1]["argv"]
    # each point: at least WAVES requests per stream, every one of equal length
    for pid in (s["pid"] for s in starts):
        bodies = [e["body"] for e in events if e["event"] == "request" and e["pid"] == pid]
        measured = [b for b in bodies if b.get("ignore_eos")]
        assert len(measured) == 4 + 4 * 4 and all(b["max_tokens"] == 8 for b in measured)
    for point in result.points:
        assert point.requests >= WAVES * point.batch
        assert all(row["tokens"] == 8 for row in point.rows)
    assert {(p.batch, p.k) for p in result.points} == {(1, 0), (1, 4), (4, 0), (4, 4)}
    assert result.settings["servers"] == "one at a time (plain, then each k)"
    assert result.environment["device_name"] == "Stand-in GPU" and result.environment["device_count"] == 2
    assert result.engine["default_args"] == [] and result.engine["dtype"] == "bfloat16"


def test_recommended_config_is_the_per_batch_schedule():
    configs = engine_configs(NGRAM, [0, 2, 4])
    assert recommended_config(configs, {1: 0, 4: 0}) is None
    assert recommended_config(configs, {1: 4, 4: 4}) == configs[2].speculative_config
    assert per_batch_schedule({1: 4, 2: 2, 8: 0}) == [[1, 1, 4], [2, 7, 2], [8, 8, 0]]
    assert per_batch_schedule({2: 4, 4: 0}) == [[1, 3, 4], [4, 4, 0]]    # vLLM wants the first range from 1
    best = recommended_config(configs, {1: 4, 2: 2, 8: 0})
    assert best["num_speculative_tokens"] == 4
    assert best["num_speculative_tokens_per_batch_size"] == [[1, 1, 4], [2, 7, 2], [8, 8, 0]]
    # vLLM's own check of that field accepts it
    assert EngineConfig(4, best).label == "ngram k=4"


def test_histogram_to_position_and_first_word():
    assert acceptance_rate_per_position([2, 1, 1]) == [0.5, 0.25]
    assert first_differing_word("a b c", "a b c") is None
    assert first_differing_word("the cat sat", "the dog sat") == {"word": 1, "text": "cat", "plain_text": "dog"}
    assert first_differing_word("the cat", "the cat sat")["text"] == "(end)"


def _engine_result():
    from specviz.runs.engine_load import EngineLoadResult, EnginePoint

    configs = engine_configs(NGRAM, [0, 4])
    figures = {"mean_acceptance_length": 2.0, "draft_acceptance_rate": 0.25, "acceptance_histogram": [4, 2, 1, 1, 0],
               "num_spec_steps": 8, "num_draft_tokens": 32, "num_accepted_draft_tokens": 8}

    def point(batch, k, speedup):
        return EnginePoint(batch=batch, k=k, speedup=speedup, speedup_low=speedup * 0.9, speedup_high=speedup * 1.1,
                           tokens_per_pass=2.0 if k else 1.0, spec_tokens_per_s=10 * speedup, plain_tokens_per_s=10,
                           spec_latency=0.05, plain_latency=0.06, theory=None, identical=True, alpha=0.25, passes=8,
                           steps=40, padding_share=0.0, regathers=0, acceptance=figures if k else None)

    return EngineLoadResult(settings={}, environment={}, configs=configs,
                            engine={"name": "vllm", "version": "0.32.0", "device": "cpu", "dtype": "float32"},
                            points=[point(1, 0, 1.0), point(1, 4, 1.5), point(4, 0, 1.0), point(4, 4, 0.9)])


def test_the_load_views_draw_an_engine_sweep_without_a_theory_line():
    from specviz.views.engine_view import NO_VERDICTS, acceptance_figure, engine_html
    from specviz.views.load_view import decision, speedup_figure

    result = _engine_result()
    assert result.recommended_k == {1: 4, 4: 0} and result.crossover_batch == 4
    assert result.recommended_speculative_config["num_speculative_tokens_per_batch_size"] == [[1, 3, 4], [4, 4, 0]]
    names = [trace.name for trace in speedup_figure(result).data]
    assert names == ["k = 4"]                     # no theory trace: vLLM's forward cost is not measured
    assert "speculate up to batch 1" in decision(result)
    bars = acceptance_figure(result).data
    assert [list(b.y) for b in bars] == [[0.5, 0.25, 0.125, 0.0]] * 2
    page = engine_html(result, "finished")
    assert NO_VERDICTS.split(",")[0] in page and "num_speculative_tokens_per_batch_size" in page
    assert result.to_dict()["recommended_speculative_config"]["method"] == "ngram"


@pytest.mark.parametrize("python, said", [("/nonexistent/python", "No Python interpreter at /nonexistent/python"),
                                          (sys.executable, "No working vLLM at")])
@pytest.mark.slow
def test_no_vllm_is_one_message_with_the_install_command(python, said, tmp_path):
    out = specviz("load", "--engine", "vllm", "--vllm-python", python, "--batch", "1", "--k", "0,4",
                  "--prompts", "rewrite", "--json", str(tmp_path / "x.json"), timeout=300)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and said in lines[0] and "scripts/make_vllm_env.sh" in lines[0], out.stderr
    assert not (tmp_path / "x.json").exists()


def _stand_in_vllm(site: Path, *, with_flag: bool = True) -> None:
    """A package named vllm with the version and the two classes specviz's check reads (not vLLM: the
    check reads files and classes, and this test changes them)."""
    (site / "vllm" / "engine").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "config").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text('__version__ = "9.9.0"\n')
    for package in ("engine", "config"):
        (site / "vllm" / package / "__init__.py").write_text("")
    flag = "    per_request_spec_decode_metrics: bool = False\n" if with_flag else ""
    (site / "vllm" / "engine" / "arg_utils.py").write_text(
        f"import dataclasses\n\n@dataclasses.dataclass\nclass EngineArgs:\n    model: str = ''\n{flag}")
    (site / "vllm" / "config" / "speculative.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass SpeculativeConfig:\n"
        "    num_speculative_tokens_per_batch_size: dict | None = None\n")


@pytest.mark.slow
def test_the_vllm_check_is_kept_per_installation_and_made_again_when_its_files_change(tmp_path, monkeypatch):
    """find_vllm imports vLLM's classes once per installation (~13 s of a core on this CPU before every
    server specviz started): the answer is kept in the cache folder, keyed by the files it was read
    from, and computed again when one of them changes."""
    from specviz.engines import vllm_install

    site = tmp_path / "site"
    _stand_in_vllm(site)
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("SPECVIZ_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(vllm_install, "_found", {})

    first = vllm_install.find_vllm(str(python))
    assert (first.version, first.device, first.torch) == ("9.9.0", "cpu", __import__("torch").__version__)
    cache = tmp_path / "cache" / vllm_install.CACHE_FILE
    (key, answer), = json.loads(cache.read_text()).items()
    assert answer == {"version": "9.9.0", "missing": []}
    # The next process reads the answer instead of importing vLLM: a changed answer in the cache shows.
    cache.write_text(json.dumps({key: {"version": "from the cache", "missing": []}}))
    monkeypatch.setattr(vllm_install, "_found", {})
    assert vllm_install.find_vllm(str(python)).version == "from the cache"
    # vLLM's files change (an older vLLM installed in their place): checked again, and refused.
    _stand_in_vllm(site, with_flag=False)
    monkeypatch.setattr(vllm_install, "_found", {})
    with pytest.raises(SpecvizError, match="too old for specviz: it lacks the server flag --per-request-spec"):
        vllm_install.find_vllm(str(python))
    assert len(json.loads(cache.read_text())) == 2


@pytest.mark.slow
def test_engine_flags_need_engine_vllm():
    out = specviz("load", "--engine-arg=--tensor-parallel-size=2", "--batch", "1", timeout=120)
    assert out.returncode == 2 and "go with --engine vllm" in out.stderr


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False


def _wait_gone(pgid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not _group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_watchdog_kills_the_whole_group_when_its_parent_is_killed(tmp_path):
    # A stand-in server that, like vLLM's, spawns a child, both ignoring SIGTERM (so SIGKILL must follow).
    tree = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "subprocess.Popen([sys.executable, '-c', 'import signal, time; "
            "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)']); time.sleep(600)")
    parent = textwrap.dedent(f"""
        import subprocess, sys, time
        sys.path.insert(0, {str(ROOT)!r})
        import specviz.engines.watchdog as w
        dog = subprocess.Popen([sys.executable, w.__file__, {str(tmp_path / 'log')!r}, sys.executable, '-c', {tree!r}],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        print(dog.stdout.readline().decode().strip(), flush=True)
        time.sleep(600)
        """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    pgid = int(proc.stdout.readline())
    time.sleep(1.5)    # the children are up
    members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
    assert len(members) >= 2, members
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _wait_gone(pgid, 20), "the stand-in server's group outlived its killed parent"


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


# ----------------------------------------------------------------------------- with vLLM

def _vllm_python() -> str:
    from specviz.engines.vllm_install import find_vllm

    try:
        return find_vllm().python
    except SpecvizError as error:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the vLLM tests (.ci/run builds vLLM's environment): {error}")
        pytest.skip(f"vLLM's environment is not set up: {error}")


@pytest.fixture(scope="module")
def vllm_python():
    return _vllm_python()


@pytest.fixture(scope="module")
def builtin_folder():
    from specviz.engines import model_location

    return model_location(None)


@pytest.fixture(scope="module")
def prompt_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    path.write_text("\n".join(PROMPTS) + "\n")
    return path


@pytest.fixture(scope="module")
def servers(vllm_python, builtin_folder, tmp_path_factory):
    """A plain and an ngram k = 4 server (fp32), started together, shared by this module's tests."""
    from specviz.engines.vllm_install import find_vllm
    from specviz.engines.vllm_server import start_server

    install = find_vllm(vllm_python)
    logs = tmp_path_factory.mktemp("vllm-logs")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    handles = {k: start_server(install, builtin_folder, label=f"test k={k}", dtype="fp32",
                               speculative_config=speculative_config(NGRAM, k), log_dir=logs)
               for k in (0, 4)}     # the CPU's defaults (--enforce-eager --max-model-len 1024) come by themselves
    try:
        for handle in handles.values():
            handle.wait_ready(600)
        yield {k: h.url for k, h in handles.items()}
    finally:
        for handle in handles.values():
            handle.stop()
        for handle in handles.values():
            assert _wait_gone(handle.pid, 30), f"{handle.label} outlived its stop"


@pytest.fixture(scope="module")
def sweep(servers, prompt_file, tmp_path_factory):
    out = tmp_path_factory.mktemp("sweep") / "load.json"
    run = specviz("load", "--engine", "vllm", "--engine-url", f"0={servers[0]}", "--engine-url", f"4={servers[4]}",
                  "--draft", "ngram", "--batch", "1,2", "--k", "0,4", "--prompts", str(prompt_file),
                  "--max-new-tokens", str(NEW_TOKENS), "--dtype", "float32", "--json", str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(out.read_text()), run.stdout


@pytest.mark.slow
def test_sweep_json_has_the_load_shape_and_vllms_figures(sweep):
    data, stdout = sweep
    for key in ("settings", "environment", "cost_curve", "points", "crossover_batch", "recommended_k", "engine",
                "recommended_speculative_config"):
        assert key in data
    assert data["engine"]["name"] == "vllm" and data["engine"]["version"] == "0.32.0"
    assert [c["k"] for c in data["engine"]["configs"]] == [0, 4]
    points = {(p["batch"], p["k"]): p for p in data["points"]}
    assert set(points) == {(1, 0), (1, 4), (2, 0), (2, 4)}
    assert data["settings"]["decision_metric"] == "throughput" and "ignore_eos" in data["settings"]["output_length"]
    # servers given by URL: the machine they run on is not probed, and the JSON says so
    assert data["environment"]["device"].startswith("unknown") and "host_load" in data["environment"]["client"]
    for (batch, k), p in points.items():
        assert p["plain_tokens_per_s"] > 0 and p["spec_tokens_per_s"] > 0 and p["spec_latency"] > 0
        assert p["spec_ttft"] > 0 and p["spec_itl"] > 0
        # the speedup is the named metric's ratio of the two servers' figures, each computed from its requests
        assert p["speedup"] == pytest.approx(p["spec_tokens_per_s"] / p["plain_tokens_per_s"])
        assert p["tpot_ratio"] == pytest.approx(p["plain_latency"] / p["spec_latency"])
        assert p["requests"] == len(p["rows"]) == max(len(PROMPTS), 4 * batch)     # several waves per stream
        if k:
            assert p["speedup_low"] < p["speedup_high"]     # a range from the requests, not a point
        for row in p["rows"]:
            assert {"text", "plain_text", "tokens", "plain_tokens", "identical"} <= set(row)
            assert row["identical"] == (row["text"] == row["plain_text"])
            assert row["tokens"] == row["plain_tokens"] == NEW_TOKENS      # ignore_eos: equal work
        if k == 0:
            assert p["speedup"] == 1.0 and p["acceptance"] is None
        else:
            figures = p["acceptance"]
            assert set(figures) >= {"mean_acceptance_length", "draft_acceptance_rate", "acceptance_histogram"}
            assert p["identical"] is True, [r for r in p["rows"] if not r["identical"]]   # fp32: word for word
    best = data["recommended_k"]
    config = data["recommended_speculative_config"]
    if any(best.values()):
        assert config["method"] == "ngram" and config["num_speculative_tokens"] == 4
    else:
        assert config is None
    assert "vLLM's speculative config for this traffic" in stdout


@pytest.mark.slow
def test_ngram_figures_are_consistent_with_the_token_counts(sweep):
    data, _ = sweep
    for p in data["points"]:
        if p["k"] == 0:
            continue
        figures = p["acceptance"]
        histogram, steps = figures["acceptance_histogram"], figures["num_spec_steps"]
        assert len(histogram) == 5 and sum(histogram) == steps > 0     # steps accepting 0..k drafts
        assert sum(i * n for i, n in enumerate(histogram)) == figures["num_accepted_draft_tokens"]
        assert figures["num_accepted_draft_tokens"] <= figures["num_draft_tokens"] <= 4 * steps
        assert figures["mean_acceptance_length"] == pytest.approx(1 + figures["num_accepted_draft_tokens"] / steps)
        assert figures["draft_acceptance_rate"] == pytest.approx(
            figures["num_accepted_draft_tokens"] / figures["num_draft_tokens"])
        # every speculative step emits at least one token, and its accepted drafts
        tokens = sum(r["tokens"] for r in p["rows"])
        assert steps + figures["num_accepted_draft_tokens"] <= tokens + len(p["rows"]) * 4
        assert figures["requests_reported"] == len(p["rows"])


@pytest.mark.slow
def test_plain_server_greedy_equals_transformers_generate(sweep, builtin_folder):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specviz.models import encode_prompt

    data, _ = sweep
    tokenizer = AutoTokenizer.from_pretrained(builtin_folder)
    model = AutoModelForCausalLM.from_pretrained(builtin_folder, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None       # the sweep's requests ignore EOS: so does this
    rows = next(p for p in data["points"] if p["batch"] == 1 and p["k"] == 0)["rows"]
    for row in rows:
        ids = encode_prompt(tokenizer, row["prompt"])
        with torch.no_grad():
            # The mask is given: left to infer it, generate masks every prompt token equal to the pad id,
            # which for this model is <|im_end|> (2), the end of the template's turns.
            out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS, do_sample=False)
        expected = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
        assert row["plain_text"] == expected


def _server_pgid(port: int) -> int | None:
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # the API server itself (its watchdog's command line holds the same words, in specviz's group)
        if cmdline[1:3] == [b"-m", b"vllm.entrypoints.openai.api_server"] and str(port).encode() in cmdline:
            return _pgid(int(pid))
    return None


def _engine_core_started(pgid: int) -> bool:
    """Whether the server's group holds the engine core's process (spawned by the API server; it is
    counted from its start, while it still imports vLLM, not from its first log line ~15 s later)."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if _pgid(int(pid)) == pgid and b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except (OSError, ProcessLookupError):
            continue
    return False


def _start_and_interrupt(args, sig, tmp_path):
    """Start `load --engine vllm` (it starts its own server), wait until vLLM's API server has started
    its engine core's process, then send `sig` to specviz; returns (specviz's exit code, the server's
    group id)."""
    log_dir = tmp_path / "logs"
    # More work than the wait below can outlast, so that a signal that is not acted on shows as such
    proc = subprocess.Popen([sys.executable, "-m", "specviz", "load", "--engine", "vllm", *args, "--max-new-tokens",
                             "256", "--repeats", "25", "--engine-log-dir", str(log_dir)], cwd=ROOT, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL,
                            preexec_fn=default_sigint)
    deadline, pgid = time.monotonic() + 240, None
    while time.monotonic() < deadline:
        logs = list(log_dir.glob("*.log")) if log_dir.exists() else []
        group = _server_pgid(int(logs[0].stem.rsplit("-", 1)[-1])) if logs else None
        if group is not None and _engine_core_started(group):
            pgid = group
            break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.5)
    assert pgid is not None, "the server never started its engine core"
    members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
    assert len(members) >= 2     # the API server and its engine core
    assert proc.poll() is None, "specviz ended before it could be interrupted"
    proc.send_signal(sig)
    code = wait_or_kill(proc, 60)
    return code, pgid, proc.stderr.read()


@pytest.mark.slow
def test_ctrl_c_leaves_no_vllm_process(vllm_python, prompt_file, tmp_path):
    code, pgid, stderr = _start_and_interrupt(["--batch", "1", "--k", "0", "--prompts", str(prompt_file),
                                               "--dtype", "float32"], signal.SIGINT, tmp_path)
    assert code == 130, stderr[-2000:]
    assert _wait_gone(pgid, 5), "a vLLM process outlived the command"


@pytest.mark.slow
def test_sigkill_of_specviz_leaves_no_vllm_process(vllm_python, prompt_file, tmp_path):
    code, pgid, _ = _start_and_interrupt(["--batch", "1", "--k", "0", "--prompts", str(prompt_file)],
                                         signal.SIGKILL, tmp_path)
    assert code == -signal.SIGKILL
    assert _wait_gone(pgid, 30), "a vLLM process outlived specviz killed with SIGKILL"


@pytest.mark.slow
def test_a_model_vllm_cannot_load_gives_its_log_not_a_hang(vllm_python, tmp_path):
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text(json.dumps({"model_type": "no-such-architecture"}))
    started = time.monotonic()
    out = specviz("load", "--engine", "vllm", "--target", str(bad), "--batch", "1", "--k", "0",
                  "--prompts", "rewrite", timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "The vLLM server (plain) exited with code" in out.stderr and "last lines of its log" in out.stderr
    assert time.monotonic() - started < 240


@pytest.mark.slow
def test_compare_on_vllm_draft_model_against_the_plain_server(servers, builtin_folder, prompt_file, tmp_path):
    out_file = tmp_path / "compare.json"
    run = specviz("compare", "--engine", "vllm", "--engine-url", f"0={servers[0]}", "--draft", builtin_folder,
                  "--k", "2", "--prompts", str(prompt_file), "--max-new-tokens", str(NEW_TOKENS), "--dtype",
                  "float32", "--json", str(out_file))
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(out_file.read_text())
    (config,) = data["configurations"]
    assert config["config"].startswith("draft_model") and config["prompts"] == len(PROMPTS)
    low, high = config["speedup_ci95"]
    assert low <= config["speedup_median"] <= high
    # the draft is the target itself: vLLM accepts (almost) every draft
    figures = data["vllm_acceptance"][config["config"]]
    assert figures["draft_acceptance_rate"] > 0.9, figures
    assert len(data["rows"]) == len(PROMPTS)
    differing = {m["prompt_id"] for m in data["mismatches"]}
    assert differing == {r["prompt_id"] for r in data["rows"] if r["identical"] is False}
    for m in data["mismatches"]:
        assert m["first_difference"]["text"] != m["first_difference"]["plain_text"]
    assert "identical to the plain server's" in run.stdout or "differs from the plain server's" in run.stdout


@pytest.mark.slow
def test_the_load_tab_runs_one_drafter_on_all_three_engines(servers, monkeypatch):
    """The Load tab's "all three": the own loop on the built-in model, vLLM on the module's servers (named
    by the operator's SPECVIZ_VLLM_URLS, so none is started) and llama.cpp's real server, then the three
    side by side: each engine's step cost, speedup and acceptance, the servers' greedy texts equal to plain."""
    from specviz.settings import LOCAL
    from specviz.ui import load_tab
    from specviz.ui.common import PROMPT_LOOKUP, TICK

    monkeypatch.setenv("SPECVIZ_VLLM_URLS", f"0={servers[0]},4={servers[4]}")
    monkeypatch.setenv("SPECVIZ_LLAMACPP_THREADS", "1")      # beside the vLLM servers on two cores
    shown = [v for v in load_tab.load_work_fn(LOCAL)(PROMPT_LOOKUP, "", 8, "1", "0,4", "rewrite", 16, load_tab.ALL)
             if v is not TICK]
    last = shown[-1]
    assert "Finished: three engines" in last.status, last.rows
    assert "no figures" not in last.rows, last.rows
    for title in ("specviz&#x27;s loop", "vLLM", "llama.cpp"):        # its ratios, and its clock's times
        assert last.rows.count(f"<td>{title}</td>") == 2, last.rows
    # the servers' greedy texts equal their plain server's: the vLLM and llama.cpp rows end in "yes"
    assert last.rows.count("<td>yes</td></tr>") >= 2, last.rows
    assert [t.name for t in last.speedup.data] == ["specviz's loop", "vLLM", "llama.cpp"]
    assert all(y > 0 for t in last.throughput.data for y in t.y)          # each engine's plain step cost
    assert last.decision.startswith("Batch 1, k = 4, speedup in decode-only time per token: specviz's loop **")
    assert "llama.cpp **" in last.decision


def test_the_load_tab_offers_vllm_hosted_only_when_the_operator_enables_it(monkeypatch):
    from specviz.settings import LOCAL, hosted
    from specviz.ui import load_tab
    from specviz.ui.common import EARLY_EXIT, PROMPT_LOOKUP, presets
    from specviz.ui.load_engine import VLLM, vllm_offered

    limits = hosted(presets())
    monkeypatch.delenv("SPECVIZ_HOSTED_VLLM", raising=False)
    assert vllm_offered(LOCAL) and not vllm_offered(limits)
    (view,) = list(load_tab.load_work_fn(limits)(PROMPT_LOOKUP, "", 8, "1", "0,4", "rewrite", 16, VLLM))
    assert "does not run vLLM" in view.status and "SPECVIZ_HOSTED_VLLM=1" in view.status
    monkeypatch.setenv("SPECVIZ_HOSTED_VLLM", "1")
    assert vllm_offered(limits)
    (view,) = [v for v in load_tab.load_work_fn(limits)(PROMPT_LOOKUP, "", 8, "1,8", "0,4", "rewrite", 16, VLLM)]
    assert "up to 4" in view.status                        # the hosted caps apply to vLLM too
    (view,) = [v for v in load_tab.load_work_fn(LOCAL)(EARLY_EXIT, "", 8, "1", "0,4", "rewrite", 16, VLLM)]
    assert "vLLM has no drafter like" in view.status and "self:8" in view.status


@pytest.mark.slow
def test_a_server_that_dies_mid_sweep_keeps_the_finished_points(servers, prompt_file, tmp_path):
    # The module's speculative server is killed here, so this test runs after the others that use it.
    out_file = tmp_path / "load.json"
    proc = subprocess.Popen([sys.executable, "-m", "specviz", "load", "--engine", "vllm", "--engine-url",
                             f"0={servers[0]}", "--engine-url", f"4={servers[4]}", "--draft", "ngram", "--batch",
                             "1,2", "--k", "0,4", "--prompts", str(prompt_file), "--max-new-tokens", str(NEW_TOKENS),
                             "--dtype", "float32", "--json", str(out_file)],
                            cwd=ROOT, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    pgid = _server_pgid(int(servers[4].rsplit(":", 1)[-1]))
    deadline = time.monotonic() + 400
    for line in proc.stderr:
        if line.startswith("batch   1 k 4:"):      # batch 1 is measured: the speculative server crashes now
            os.kill(pgid, signal.SIGKILL)          # the API server only; its watchdog ends the rest
            break
        assert time.monotonic() < deadline
    else:
        pytest.fail("the sweep ended before batch 1 was measured")
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 2, stderr[-2000:]
    assert "points that finished are kept" in stderr
    data = json.loads(out_file.read_text())
    # the plain server measured both batch sizes before the speculative one started
    assert {(p["batch"], p["k"]) for p in data["points"]} == {(1, 0), (2, 0), (1, 4)}
    assert data["error"]
    assert _wait_gone(pgid, 30)


def test_the_compare_tab_runs_a_prompt_set_on_vllm_only_where_it_is_offered(monkeypatch, tmp_path):
    from specviz.settings import LOCAL, hosted
    from specviz.ui import compare_sets, compare_tab
    from specviz.ui.common import CHAT, presets
    from specviz.ui.load_engine import VLLM

    monkeypatch.delenv("SPECVIZ_HOSTED_VLLM", raising=False)
    rows = [[True, "", "ngram", 4, False, 0, ""]]
    examples = compare_sets.sources(LOCAL)[1]
    views = [v for v in compare_tab.compare_work(hosted(presets()))("", rows, 16, 0, CHAT, examples, None, 1, VLLM)
             if v is not compare_tab.TICK]
    assert "does not run vLLM" in views[-1].status
    two = rows + [[True, str(tmp_path), "ngram", 2, False, 0, ""]]
    (tmp_path / "config.json").write_text("{}")
    views = [v for v in compare_tab.compare_work(LOCAL)("", two, 16, 0, CHAT, examples, None, 1, VLLM)
             if v is not compare_tab.TICK]
    assert "the same target" in views[-1].status
    # 'head' alone is the built-in's shipped head: on vLLM, refused for a row with another target.
    head = [[True, str(tmp_path), "head", 2, False, 0, ""]]
    views = [v for v in compare_tab.compare_work(LOCAL)("", head, 16, 0, CHAT, examples, None, 1, VLLM)
             if v is not compare_tab.TICK]
    assert f"and the target is {tmp_path}" in views[-1].status, views[-1].status


def _own_steps(pair, drafter, k: int) -> list[list[tuple[int, int]]]:
    """specviz's drafting steps per request, as (drafted, accepted) in order (fp32 greedy, the prompts'
    chat encoding); cycles that drafted nothing are left out, as vLLM leaves them out of its arrays."""
    from specviz import speculative_decode
    from specviz.models import encode_prompt

    return [[(len(c.drafted), c.num_accepted)
             for c in speculative_decode(pair.target, drafter, encode_prompt(pair.tokenizer, prompt),
                                         max_new_tokens=NEW_TOKENS, k=k, eos_token_id=pair.eos_token_ids)
             if c.drafted]
            for prompt in PROMPTS]


def _same_steps(vllm: list[tuple[int, int]], own: list[tuple[int, int]]) -> bool:
    """Whether specviz took vLLM's drafting steps, (drafted, accepted) each: the same drafts, so at every
    step specviz accepted what vLLM accepted of the drafts both made. specviz drafts no more than its
    token budget has room for (vLLM drafts k to the end, and once more when specviz has room for one last
    token only: it drafts nothing there, a step vLLM's arrays have and specviz's do not)."""
    return len(own) <= len(vllm) <= len(own) + 1 and all(
        ours <= theirs and accepted == min(accepted_vllm, ours)
        for (theirs, accepted_vllm), (ours, accepted) in zip(vllm, own))


def _miswired_heads(folder: Path, out: Path) -> dict[str, Path]:
    """The shipped head with its features read another way: the fc's three blocks in reverse order, and
    other layers (what a wrong fc order or wrong layer ids in one engine would draft from)."""
    import torch
    from safetensors.torch import load_file, save_file

    heads = {}
    for name in ("fc order", "layer ids"):
        variant = out / name.replace(" ", "-")
        variant.mkdir(parents=True)
        weights = load_file(str(folder / "model.safetensors"))
        config = json.loads((folder / "config.json").read_text())
        if name == "fc order":
            weights["fc.weight"] = torch.cat(weights["fc.weight"].chunk(3, dim=1)[::-1], dim=1).contiguous()
        else:
            config["eagle_aux_hidden_state_layer_ids"] = [3, 14, 26]
        save_file(weights, str(variant / "model.safetensors"))
        (variant / "config.json").write_text(json.dumps(config))
        heads[name] = variant
    return heads


@pytest.mark.slow
def test_the_shipped_eagle3_head_gives_one_answer_and_one_acceptance_in_vllm_and_in_specviz(servers, vllm_python,
                                                                                         builtin_folder, tmp_path,
                                                                                         monkeypatch):
    # The shipped head (trained: its drafts follow the target's fused hidden states), served by vLLM as
    # method eagle3 and drafting in specviz's loop, fp32 greedy: the texts equal the plain server's, and
    # per request the two engines take the same drafting steps (`_same_steps`: near the end of the token
    # budget specviz drafts fewer, and accepts what vLLM accepted of those). The comparison has
    # power: in specviz, the same head reading its features in another fc order or from other layers
    # accepts differently on these prompts (a random head would be accepted almost never, in either
    # engine, whatever it read: nothing to compare). Mean acceptance lengths within 10%.
    from specviz.engines import closed_loop
    from specviz.engines.vllm_client import Request
    from specviz.engines.vllm_install import find_vllm
    from specviz.engines.vllm_server import SERVED_NAME, start_server
    from specviz.models import load_pair
    from specviz.models.head_files import shipped_head
    from specviz.models.heads import load_head

    k = 3
    monkeypatch.setenv("SPECVIZ_HEAD_INT8", "0")     # the float head vLLM serves (int8 drafts differ at near ties)
    pair = load_pair(None, "head", dtype="float32")
    assert pair.draft.weights == "float32"
    ours = _own_steps(pair, pair.draft, k)
    for name, variant in _miswired_heads(shipped_head(pair.target_name), tmp_path / "miswired").items():
        miswired = _own_steps(pair, load_head(variant, pair.target, target_name=pair.target_name), k)
        assert [[a for _, a in steps] for steps in miswired] != [[a for _, a in steps] for steps in ours], \
            f"a head with another {name} accepts the same: the comparison would not see it"

    requests = [Request(i, p, True, NEW_TOKENS) for i, p in enumerate(PROMPTS)]
    plain = sorted(closed_loop(servers[0], SERVED_NAME, requests, 1), key=lambda r: r.index)
    handle = start_server(find_vllm(vllm_python), builtin_folder, label="test eagle3", dtype="fp32",
                          speculative_config=speculative_config(parse_draft("head"), k), log_dir=tmp_path)
    try:
        handle.wait_ready(600)
        spec = sorted(closed_loop(handle.url, SERVED_NAME, requests, 1), key=lambda r: r.index)
    finally:
        handle.stop()
    totals = {"vLLM": [0, 0], "specviz": [0, 0]}      # steps, accepted drafts
    for prompt, theirs, plain_response, own in zip(PROMPTS, spec, plain, ours):
        assert theirs.text == plain_response.text, prompt
        vllm = list(zip(theirs.spec["per_step_drafted"], theirs.spec["per_step_accepted"]))
        assert _same_steps(vllm, own), (prompt, vllm, own)
        for engine, steps in (("vLLM", vllm), ("specviz", own)):
            totals[engine][0] += len(steps)
            totals[engine][1] += sum(accepted for _, accepted in steps)
    mean_length = {engine: 1 + accepted / steps for engine, (steps, accepted) in totals.items()}
    assert totals["specviz"][1] > 0 and abs(mean_length["vLLM"] / mean_length["specviz"] - 1) <= 0.10, mean_length
    print(f"mean acceptance length, k {k}: vLLM {mean_length['vLLM']:.3f}, specviz {mean_length['specviz']:.3f}")

