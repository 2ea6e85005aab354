"""llama.cpp as the engine (specviz.engines.llamacpp, `--engine llamacpp`).

The fast tests check the mapping of drafters to llama-server flags, the counters' arithmetic, the
refusal of an xllamacpp whose speculative-params API is unknown (and of a missing one) through the
command itself, with a stand-in `xllamacpp` package first on the path. The slow ones start llama.cpp's
real server (xllamacpp, the built-in GGUF): the `load` command's sweep, Ctrl-C and a server that
cannot start, each leaving no llama.cpp process behind.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import default_sigint, wait_or_kill

from specviz.engines import llamacpp
from specviz.engines.configs import EngineConfig
from specviz.errors import SpecvizError
from specviz.settings import parse_draft

ROOT = Path(__file__).resolve().parent.parent
SERVER = "llamacpp_server.py"
NEW_TOKENS = 16

xllamacpp_missing = pytest.mark.skipif(
    subprocess.run([sys.executable, "-c", "import xllamacpp"], capture_output=True).returncode != 0
    and not os.environ.get("CI"),
    reason="xllamacpp is not installed (pip install 'specviz[llamacpp]')")


# llama.cpp's threads wait for each other by spinning: with as many threads as cores, a test server
# starves the other xdist worker's tests (browsers timed out, and the sweep ran past 300 s, in a CI
# run here). One thread has nothing to wait for.
ONE_THREAD = ("--threads", "1")


def env(**extra) -> dict:
    return dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", **extra)


def specviz(*args, timeout=300, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specviz", *args], capture_output=True, text=True, cwd=ROOT,
                          timeout=timeout, stdin=subprocess.DEVNULL, **{"env": env(), **kwargs})


def servers() -> set[int]:
    """The pids of llama.cpp servers (xllamacpp's, started by specviz) running now."""
    out = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(word.endswith(SERVER.encode()) for word in cmdline[1:2]) and b"--probe" not in cmdline:
            out.add(int(pid))
    return out


def wait_gone(pids: set[int], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while servers() & pids and time.monotonic() < deadline:
        time.sleep(0.2)
    return not servers() & pids


# ----------------------------------------------------------------------------- no server needed

def test_drafters_map_to_llama_server_flags():
    ngram = llamacpp.speculative_config(parse_draft("ngram"), 4)
    assert llamacpp.spec_flags(ngram) == ["--spec-type", "ngram-simple", "--spec-draft-n-max", "4",
                                          "--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4"]
    draft = llamacpp.speculative_config(None, 3, llamacpp.parse_speculative_config(
        '{"type": "draft-simple", "model": "/m/draft.gguf"}'))
    assert llamacpp.spec_flags(draft) == ["--spec-type", "draft-simple", "--spec-draft-n-max", "3",
                                          "--model-draft", "/m/draft.gguf"]
    mod = llamacpp.speculative_config(None, 6, {"type": "ngram-mod", "n_match": 8})
    assert "--spec-ngram-mod-n-match" in llamacpp.spec_flags(mod) and mod["draft_n_max"] == 6
    # ngram-mod's own draft lengths follow k (llama.cpp's defaults, 48 to 64 tokens, ignore --spec-draft-n-max)
    flags = " ".join(llamacpp.spec_flags(mod))
    assert "--spec-ngram-mod-n-max 6" in flags and "--spec-ngram-mod-n-min 1" in flags
    longer = llamacpp.speculative_config(None, 2, {"type": "ngram-mod", "n_min": 4, "n_max": 64})
    assert (longer["n_min"], longer["n_max"]) == (2, 2)
    assert llamacpp.speculative_config(parse_draft("ngram"), 0) is None
    with pytest.raises(SpecvizError, match="llama.cpp has no drafter like"):
        llamacpp.speculative_config(parse_draft("self:8"), 4)
    with pytest.raises(SpecvizError, match='"type"'):
        llamacpp.parse_speculative_config('{"method": "ngram"}')
    # the flags the stand-alone server understands are the ones the mapping writes
    from specviz.engines.llamacpp_server import FLAGS
    assert {flag for flag in llamacpp.spec_flags(ngram) + llamacpp.spec_flags(draft) + llamacpp.spec_flags(mod)
            if flag.startswith("--")} - {"--spec-type"} <= set(FLAGS)


def test_a_gguf_only_engine_refuses_a_folder(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(SpecvizError, match="llama.cpp runs GGUF files"):
        llamacpp.gguf_location(str(tmp_path))
    assert llamacpp.gguf_location(None).endswith(".gguf")       # the built-in model's own file


def test_server_counters_become_steps_histogram_and_positions():
    text = "\n".join(["# HELP llamacpp:spec_decode_num_drafts_total x", "llamacpp:spec_decode_num_drafts_total 16",
                      'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 8',
                      'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 7',
                      'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 3',
                      'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 1'])
    before = {"drafts": 10.0, "per_position": [5.0, 5.0, 1.0]}
    counted = llamacpp.counted_acceptance(before, llamacpp.parse_metrics(text))
    # 6 steps: 3 accepted at position 1, 2 of them at 2, 2 at 3, 1 at 4
    assert counted == {"num_spec_steps": 6, "acceptance_histogram": [3, 1, 0, 1, 1],
                       "accepted_per_position": [3, 2, 2, 1]}
    from specviz.metrics import acceptance_rate_per_position
    assert acceptance_rate_per_position(counted["acceptance_histogram"]) == [3 / 6, 2 / 6, 2 / 6, 1 / 6]


def test_the_recommendation_is_llama_server_flags():
    engine = llamacpp.LlamaCppEngine(model="/m/t.gguf", threads=2, parallel=4)
    configs = llamacpp.engine_configs(parse_draft("ngram"), [4])
    assert engine.recommended_config(configs, {1: 0, 4: 0}) is None
    copy = engine.recommended_config(configs, {1: 4, 4: 0})
    assert copy["flags"].startswith("llama-server --model /m/t.gguf") and "--parallel 4" in copy["flags"]
    assert "--spec-type ngram-simple --spec-draft-n-max 4" in copy["flags"]
    assert copy["pays_at_batch"] == [1] and copy["off_at_batch"] == [4]
    assert engine.recommended_config([EngineConfig(0, None)], {1: 0}) is None


def _stand_in(tmp_path, body: str) -> dict:
    package = tmp_path / "xllamacpp"
    package.mkdir()
    (package / "__init__.py").write_text(body)
    return env(PYTHONPATH=f"{tmp_path}{os.pathsep}{ROOT}")


@pytest.mark.slow
def test_an_unknown_speculative_api_is_refused_by_the_command(tmp_path):
    stand_in = _stand_in(tmp_path, "class _S:\n    n_max = 4\n\nclass CommonParams:\n"
                                   "    def __init__(self):\n        self.speculative = _S()\n\n"
                                   "def get_system_info():\n    return ''\n__version__ = '2030.1'\n")
    out = specviz("load", "--engine", "llamacpp", "--draft", "ngram", "--batch", "1", "--k", "0,4", "--prompts",
                  "rewrite", "--max-new-tokens", "8", env=stand_in)
    assert out.returncode == 2, out.stderr
    assert "speculative-params API specviz does not drive" in out.stderr and "'unknown'" in out.stderr
    assert "pip install -U 'xllamacpp>=" in out.stderr
    assert not servers()


@pytest.mark.slow
def test_a_missing_xllamacpp_is_one_message_with_the_install_command(tmp_path):
    stand_in = _stand_in(tmp_path, "raise ImportError('No module named xllamacpp')\n")
    out = specviz("load", "--engine", "llamacpp", "--batch", "1", "--k", "0", "--prompts", "rewrite", env=stand_in)
    assert out.returncode == 2 and "pip install 'specviz[llamacpp]'" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_engine_flags_go_with_their_engine():
    import argparse

    from specviz.cli.engine import add_engine_arguments, check_engine_flags
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    with pytest.raises(SpecvizError, match="go with --engine vllm or --engine llamacpp"):
        check_engine_flags(parser.parse_args(["--llama-server", "llama-server"]))
    with pytest.raises(SpecvizError, match="--vllm-python goes with --engine vllm"):
        check_engine_flags(parser.parse_args(["--engine", "llamacpp", "--vllm-python", sys.executable]))
    check_engine_flags(parser.parse_args(["--engine", "llamacpp", "--llama-server", "llama-server"]))


def test_the_load_tab_offers_llamacpp_locally_and_hosted_only_when_enabled(monkeypatch):
    from specviz.settings import LOCAL, hosted
    from specviz.ui import load_tab
    from specviz.ui.common import EARLY_EXIT, PROMPT_LOOKUP, presets
    from specviz.ui.load_engine import LLAMACPP, offered_engines

    limits = hosted(presets())
    monkeypatch.delenv("SPECVIZ_HOSTED_LLAMACPP", raising=False)
    assert LLAMACPP in offered_engines(LOCAL) and LLAMACPP not in offered_engines(limits)
    (view,) = list(load_tab.load_work_fn(limits)(PROMPT_LOOKUP, "", 8, "1", "0,4", "rewrite", 16, LLAMACPP))
    assert "does not run llama.cpp" in view.status and "SPECVIZ_HOSTED_LLAMACPP=1" in view.status
    monkeypatch.setenv("SPECVIZ_HOSTED_LLAMACPP", "1")
    assert LLAMACPP in offered_engines(limits)
    (view,) = list(load_tab.load_work_fn(LOCAL)(EARLY_EXIT, "", 8, "1", "0,4", "rewrite", 16, LLAMACPP))
    assert "llama.cpp has no drafter like" in view.status


# ----------------------------------------------------------------------------- real servers

@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llamacpp")
    before = servers()
    out = specviz("load", "--engine", "llamacpp", "--draft", "ngram", "--batch", "1,4", "--k", "0,4", "--prompts",
                  "rewrite", "--max-new-tokens", str(NEW_TOKENS), "--json", str(folder / "out.json"),
                  "--engine-log-dir", str(folder / "logs"), *ONE_THREAD, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out, json.loads((folder / "out.json").read_text()), before


@pytest.mark.slow
@xllamacpp_missing
def test_load_on_llamacpp_writes_points_with_its_acceptance(sweep):
    out, data, _ = sweep
    assert data["settings"]["engine"] == "llamacpp" and data["engine"]["name"] == "llamacpp"
    assert data["engine"]["parallel"] == 4 and data["engine"]["server"] == "xllamacpp"
    assert [(p["batch"], p["k"]) for p in data["points"]] == [(1, 0), (1, 4), (4, 0), (4, 4)]
    for point in data["points"]:
        assert point["plain_tokens_per_s"] > 0 and point["spec_ttft"] > 0
        assert all(row["tokens"] == row["plain_tokens"] == NEW_TOKENS for row in point["rows"])
        if not point["k"]:
            continue
        figures = point["acceptance"]
        assert figures["steps_from"] == "server counters"
        assert 0 < figures["num_accepted_draft_tokens"] <= figures["num_draft_tokens"]
        # the per-request figures and the server's counters describe the same requests
        assert sum(figures["accepted_per_position"]) == figures["num_accepted_draft_tokens"]
        assert len(figures["accepted_per_position"]) <= 4 and sum(figures["acceptance_histogram"]) == \
            figures["num_spec_steps"] > 0
        if point["batch"] == 1:
            assert point["identical"] is True      # greedy, one stream: every speculative text equals the plain one
        else:
            # Batched, llama.cpp's quantised kernels can flip a near-tie when the verification batch
            # changes shape (seen here mid-answer at batch 4): reported per row, with where it parts.
            assert all(row["identical"] or row["first_difference"]["text"] != row["first_difference"]["plain_text"]
                       for row in point["rows"])
    copy = data["recommended_speculative_config"]
    assert copy is None or "--spec-type ngram-simple" in copy["flags"]
    assert "llama.cpp's server for this traffic" in out.stdout and "accepted at each position" in out.stdout


@pytest.mark.slow
@xllamacpp_missing
def test_no_llamacpp_server_outlives_the_sweep(sweep):
    _, _, before = sweep
    assert wait_gone(servers() - before, 5)


def _start(args, tmp_path):
    log_dir = tmp_path / "logs"
    proc = subprocess.Popen([sys.executable, "-m", "specviz", "load", "--engine", "llamacpp", *args, *ONE_THREAD,
                             "--engine-log-dir", str(log_dir)], cwd=ROOT, env=env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL, preexec_fn=default_sigint)
    return proc, log_dir


@pytest.mark.slow
@xllamacpp_missing
@pytest.mark.parametrize("sent, code, seconds", [(signal.SIGINT, 130, 10), (signal.SIGKILL, -signal.SIGKILL, 30)],
                         ids=["ctrl-c", "sigkill"])
def test_ctrl_c_or_sigkill_leaves_no_llamacpp_server(tmp_path, sent, code, seconds):
    # Ctrl-C: specviz stops its server itself; SIGKILL: specviz cannot, the server's watchdog does.
    before = servers()
    proc, log_dir = _start(["--batch", "1", "--k", "0", "--prompts", "rewrite", "--max-new-tokens", "256",
                            "--repeats", "50"], tmp_path)
    deadline, running = time.monotonic() + 60, set()
    while time.monotonic() < deadline and not running:
        logs = list(log_dir.glob("*.log")) if log_dir.exists() else []
        if logs and "listening on" in logs[0].read_text(errors="replace"):
            running = servers() - before
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.2)
    assert running, "the server never started"
    time.sleep(1.0)                                     # requests in flight
    proc.send_signal(sent)
    assert wait_or_kill(proc, 60) == code, proc.stderr.read()[-2000:]
    assert wait_gone(running, seconds), f"a llama.cpp server outlived {sent.name}"


@pytest.mark.slow
@xllamacpp_missing
def test_a_server_that_cannot_start_gives_its_log_and_leaves_nothing(tmp_path):
    before = servers()
    out = specviz("load", "--engine", "llamacpp", "--batch", "1", "--k", "0", "--prompts", "rewrite",
                  "--engine-arg=--no-such-flag", "--engine-log-dir", str(tmp_path))
    assert out.returncode == 2 and "The llama.cpp server (plain) exited" in out.stderr, out.stderr[-2000:]
    assert "--no-such-flag" in out.stderr                      # its log's last lines say why
    assert wait_gone(servers() - before, 5)


@pytest.mark.slow
@xllamacpp_missing
def test_the_compare_tab_runs_a_prompt_set_on_llamacpp(monkeypatch):
    # The Compare tab's engine choice over a prompt set (the rewrite set): the plain server and one
    # prompt-lookup server, real ones; llama.cpp's acceptance and equal texts in the status; no server left.
    import html

    from specviz.settings import LOCAL
    from specviz.ui import compare_sets, compare_tab
    from specviz.ui.common import CHAT
    from specviz.ui.load_engine import LLAMACPP

    monkeypatch.setenv("SPECVIZ_LLAMACPP_THREADS", "1")        # see ONE_THREAD
    (rewrite,) = [source for source in compare_sets.sources(LOCAL) if source.startswith("Set: rewrite")]
    before = servers()
    rows = [[True, "", "ngram", 4, False, 0, ""]]
    views = [v for v in compare_tab.compare_work(LOCAL)("", rows, NEW_TOKENS, 0, CHAT, rewrite, None, 1, LLAMACPP)
             if v is not compare_tab.TICK]
    status = html.unescape(views[-1].status)
    assert "llama.cpp: 1 configuration over 5 prompts" in status, status
    accepted = re.search(r"llama.cpp's mean acceptance length ([0-9.]+), ([0-9]+)% of drafts accepted", status)
    assert accepted and float(accepted[1]) > 1 and int(accepted[2]) > 0, status
    assert "differs from plain" not in status, status
    assert wait_gone(servers() - before, 10)
