"""vLLM as the engine (specviz.engines, runs.engine_load, runs.engine_compare, `--engine vllm`).

The fast tests check the mapping of drafters to vLLM's configs, the messages for a missing vLLM, and
the watchdog on a stand-in process tree. The slow ones start vLLM's CPU server on the built-in model
(real servers, no mocks): two servers (plain and ngram k = 4, fp32) shared by the module, plus the
servers the commands under test start themselves. They need vLLM's environment
(`bash scripts/make_vllm_env.sh`, SPECVIZ_VLLM_PYTHON): without it they skip, except in CI (CI set),
where .ci/run builds it and a missing vLLM fails.
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

from specviz.engines import configs as engine_configs_module
from specviz.engines.configs import (EngineConfig, engine_configs, per_batch_schedule, recommended_config,
                                     speculative_config)
from specviz.errors import SpecvizError
from specviz.runs.engine_load import acceptance_by_position, first_differing_word

ROOT = Path(__file__).resolve().parent.parent
ENGINE_ARGS = ["--engine-arg=--enforce-eager", "--engine-arg=--max-model-len=1024"]
PROMPTS = ["Rewrite more formally: hey, the meeting moved to friday, tell the others and bring the slides.",
           "Fix the spelling: Teh quick brown fox jumpd over teh lazy dog and ran awya from teh farmer.",
           "Rewrite in the past tense: I walk to the station, I buy a ticket and I wait for the train.",
           "Make this polite: send me the report now, I need the numbers for the meeting."]
NEW_TOKENS = 24


def env(**extra) -> dict:
    out = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_CPU_KVCACHE_SPACE="1")
    out.update(extra)
    return out


def specviz(*args, timeout=600, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True, cwd=ROOT,
                          env=env(), timeout=timeout, stdin=subprocess.DEVNULL, **kwargs)


# ----------------------------------------------------------------------------- no vLLM needed

def test_drafters_map_to_vllm_configs(monkeypatch):
    assert speculative_config("ngram", 0) is None
    assert speculative_config("ngram", 4) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
                                              "prompt_lookup_max": 3}
    folder = str(ROOT / "assets")
    monkeypatch.setattr(engine_configs_module, "model_location", lambda spec, progress=None: f"/m/{spec}")
    assert speculative_config(folder, 2) == {"method": "draft_model", "model": f"/m/{folder}",
                                             "num_speculative_tokens": 2}
    given = {"method": "eagle3", "model": "org/eagle", "num_speculative_tokens": 9}
    assert speculative_config("ngram", 3, given) == dict(given, num_speculative_tokens=3)
    with pytest.raises(SpecvizError, match="no drafter like 'self:8'"):
        speculative_config("self:8", 4)
    configs = engine_configs("ngram", [0, 2, 4])
    assert [c.k for c in configs] == [0, 2, 4] and configs[0].speculative_config is None
    assert [c.label for c in configs] == ["plain", "ngram k=2", "ngram k=4"]


def test_recommended_config_is_the_per_batch_schedule():
    configs = engine_configs("ngram", [0, 2, 4])
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
    assert acceptance_by_position([2, 1, 1]) == [0.5, 0.25]
    assert first_differing_word("a b c", "a b c") is None
    assert first_differing_word("the cat sat", "the dog sat") == {"word": 1, "text": "cat", "plain_text": "dog"}
    assert first_differing_word("the cat", "the cat sat")["text"] == "(end)"


def _engine_result():
    from specviz.runs.engine_load import EngineLoadResult, EnginePoint

    configs = engine_configs("ngram", [0, 4])
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
def test_no_vllm_is_one_message_with_the_install_command(python, said, tmp_path):
    out = specviz("load", "--engine", "vllm", "--vllm-python", python, "--batch", "1", "--k", "0,4",
                  "--prompts", "rewrite", "--json", str(tmp_path / "x.json"), timeout=300)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and said in lines[0] and "scripts/make_vllm_env.sh" in lines[0], out.stderr
    assert not (tmp_path / "x.json").exists()


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
    from specviz.engines.vllm_server import find_vllm

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
    from specviz.engines.vllm_server import find_vllm, start_server

    install = find_vllm(vllm_python)
    logs = tmp_path_factory.mktemp("vllm-logs")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    handles = {k: start_server(install, builtin_folder, label=f"test k={k}", dtype="float32",
                               speculative_config=speculative_config("ngram", k),
                               engine_args=["--enforce-eager", "--max-model-len", "1024"], log_dir=logs)
               for k in (0, 4)}
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
    for (batch, k), p in points.items():
        assert p["plain_tokens_per_s"] > 0 and p["spec_tokens_per_s"] > 0 and p["spec_latency"] > 0
        assert p["speedup_low"] <= p["speedup"] <= p["speedup_high"]
        assert len(p["rows"]) == max(len(PROMPTS), 2 * batch)
        for row in p["rows"]:
            assert {"text", "plain_text", "tokens", "plain_tokens", "identical"} <= set(row)
            assert row["identical"] == (row["text"] == row["plain_text"])
            assert 0 < row["tokens"] <= NEW_TOKENS
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
    rows = next(p for p in data["points"] if p["batch"] == 1 and p["k"] == 0)["rows"]
    for row in rows:
        ids = encode_prompt(tokenizer, row["prompt"])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
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


def _start_and_interrupt(args, sig, tmp_path):
    """Start `load --engine vllm` (it starts its own server), wait until vLLM's engine core runs, then
    send `sig` to specviz; returns (specviz's exit code, the server's group id)."""
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "specviz", "load", "--engine", "vllm", *args,
                             "--engine-log-dir", str(log_dir), *ENGINE_ARGS], cwd=ROOT, env=env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    deadline, pgid = time.monotonic() + 240, None
    while time.monotonic() < deadline:
        logs = list(log_dir.glob("*.log")) if log_dir.exists() else []
        if logs and "EngineCore" in logs[0].read_text(errors="replace"):
            pgid = _server_pgid(int(logs[0].stem.rsplit("-", 1)[-1]))
            if pgid is not None:
                break
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.5)
    assert pgid is not None, "the server never started its engine core"
    members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
    assert len(members) >= 2     # the API server and its engine core
    proc.send_signal(sig)
    code = proc.wait(timeout=60)
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
                  "--prompts", "rewrite", *ENGINE_ARGS, timeout=300)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "The vLLM server (plain) exited with code" in out.stderr and "last lines of its log" in out.stderr
    assert time.monotonic() - started < 240


@pytest.mark.slow
def test_compare_on_vllm_draft_model_against_the_plain_server(servers, builtin_folder, prompt_file, tmp_path):
    out_file = tmp_path / "compare.json"
    run = specviz("compare", "--engine", "vllm", "--engine-url", f"0={servers[0]}", "--draft", builtin_folder,
                  "--k", "2", "--prompts", str(prompt_file), "--max-new-tokens", str(NEW_TOKENS), "--dtype",
                  "float32", "--json", str(out_file), *ENGINE_ARGS)
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
    assert {(p["batch"], p["k"]) for p in data["points"]} == {(1, 0), (1, 4)}
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
