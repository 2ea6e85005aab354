"""One default for torch's threads and the clock on a CPU, on every surface: a run through the library
(`runs.execute`) with nothing chosen runs on one thread timed by its CPU time, like the app and the
command line; a chosen thread count is kept and its figures say they are on the wall clock, which
load can move. Every figure's clock and basis are in the JSON."""

from __future__ import annotations

import pytest
import torch

from specviz.clocks import DECODE_ONLY, WITH_PREFILL
from specviz.models import devices
from specviz.runs.result import SECONDS_BASES
from specviz.runs.run import execute, race
from specviz.settings import RunSettings
from specviz.views.prose import summary_lines
from tiny_pair import PROMPT

SETTINGS = RunSettings(target="tiny", draft="ngram", k=4, max_new_tokens=16)


@pytest.fixture
def nothing_chosen(monkeypatch):
    """This process as a library user's: torch at two threads, specviz's threads never chosen."""
    monkeypatch.setattr(devices, "_threads_chosen", False)
    torch.set_num_threads(2)
    yield
    devices.use_threads(1)       # the suite's own choice (conftest)


def test_the_library_defaults_to_one_thread_timed_by_its_cpu_time(tiny, nothing_chosen):
    run = execute(SETTINGS, PROMPT, tiny.pair(None, "ngram"), baseline=True)
    assert run.clock == "thread CPU time"
    summary = run.summary()
    timing = summary["timing"]
    assert timing["clock"] == "thread CPU time" and timing["moved_by_load"] is False
    assert timing["basis"] == {"speedup": DECODE_ONLY, "tokens_per_second": WITH_PREFILL,
                               "baseline_tokens_per_second": WITH_PREFILL, **SECONDS_BASES}
    # every seconds field of the summary has its basis on the run's clock, or is named as on the wall clock
    seconds = {name for name in summary if name.endswith("_seconds") or name == "seconds"}
    assert seconds - set(timing["basis"]) == set(timing["wall_clock"]) == {
        "elapsed_wall_seconds", "calibration_seconds", "first_token_wall_seconds"}
    assert 0 < summary["elapsed_wall_seconds"] < 600
    assert run.to_json()["summary"]["timing"] == timing


def test_a_run_leaves_torchs_threads_as_it_found_them(tiny, nothing_chosen):
    """The library sets one thread for its run only: the process's own count (two here) comes back
    when the run ends, and when a consumer stops a race early."""
    pair = tiny.pair(None, "ngram")
    seen = [(torch.get_num_threads(), run.clock) for run in race(SETTINGS, PROMPT, pair, baseline=True)]
    assert set(seen) == {(1, "thread CPU time")}
    assert torch.get_num_threads() == 2
    assert execute(SETTINGS, PROMPT, pair).clock == "thread CPU time" and torch.get_num_threads() == 2
    stopped = race(SETTINGS, PROMPT, pair, baseline=True)
    next(stopped)
    assert torch.get_num_threads() == 1
    stopped.close()
    assert torch.get_num_threads() == 2


def test_cpu_runs_on_a_host_with_a_gpu_take_one_thread_too(tiny, nothing_chosen, monkeypatch):
    """The app's default on a host with CUDA keeps torch's threads for the GPU's runs; a run on the
    CPU there still takes one thread and its CPU time, as on any CPU."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    devices.use_threads(None)           # what the app does without SPECVIZ_THREADS
    assert torch.get_num_threads() == 2
    run = execute(SETTINGS, PROMPT, tiny.pair(None, "ngram"), baseline=True)
    assert run.clock == "thread CPU time" and torch.get_num_threads() == 2


def test_a_chosen_thread_count_is_kept_and_its_figures_say_the_wall_clock(tiny, nothing_chosen):
    devices.use_threads(2)
    run = execute(SETTINGS, PROMPT, tiny.pair(None, "ngram"), baseline=True)
    assert torch.get_num_threads() == 2
    assert run.clock == "wall clock"
    assert run.summary()["timing"]["moved_by_load"] is True
    compared = next(line for line in summary_lines(run) if line.strip().startswith("compared:"))
    assert "timed by wall clock (other programs on this machine can move it)" in compared


def test_loading_a_pair_sets_the_default_before_anything_is_timed(nothing_chosen, monkeypatch):
    # The commands (bench's own timing of transformers included) load through runs.run.load first.
    from specviz.runs import run as run_module

    monkeypatch.setattr(run_module, "tiny_pair", lambda *args, **kwargs: "pair")
    assert run_module.load(RunSettings(target="tiny", device="cpu")) == "pair"
    assert torch.get_num_threads() == 1


def test_threads_below_one_are_refused():
    with pytest.raises(Exception, match="at least 1"):
        devices.use_threads(0)


def test_every_commands_json_names_its_figures_clock_and_basis(tmp_path):
    # bench rates whole generations (with prefill); the load sweep and an engine's sweep say theirs.
    import json

    from specviz.cli import entry
    from specviz.runs.engine_load import ENGINE_CLOCK, sweep_settings

    out = tmp_path / "bench.json"
    assert entry(["bench", "--target", "tiny", "--draft", "ngram", "--category", "code", "--limit", "1",
                  "--max-new-tokens", "8", "--quiet", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["timing"]["clock"] == data["meta"][0]["clock"] == "thread CPU time"
    assert data["timing"]["basis"]["specviz_speedup"] == WITH_PREFILL
    for metric, basis in (("throughput", WITH_PREFILL), ("tpot", DECODE_ONLY)):
        timing = sweep_settings(SETTINGS, [], [1], [0, 4], 1, metric, "cpu")["timing"]
        assert timing["clock"] == ENGINE_CLOCK and timing["moved_by_load"] is True
        assert timing["basis"]["speedup"] == basis and timing["basis"]["tpot_ratio"] == DECODE_ONLY


def test_the_app_shortens_the_interpreter_switch_interval_and_says_so():
    # A race takes the interpreter lock back after each of its many short torch operations: at Python's
    # default 5 ms the server's own Python work stalls it (specviz.ui.app.SWITCH_SECONDS says what was measured).
    import sys

    import torch

    from specviz.ui.app import SWITCH_SECONDS, configure_torch

    before, threads, grad = sys.getswitchinterval(), torch.get_num_threads(), torch.is_grad_enabled()
    try:
        line = configure_torch()
        assert sys.getswitchinterval() == pytest.approx(SWITCH_SECONDS) and SWITCH_SECONDS < 0.005
        assert "switch interval 0.5 ms" in line
    finally:
        sys.setswitchinterval(before)
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
