"""The app as an API client sees it ("Use via API"): a hosted-mode server on tiny models in a
subprocess, every public endpoint called with out-of-range values, and a cancel that must really
stop the server's work."""

import os
import time
from pathlib import Path

import pytest
from conftest import running_app

from specviz.runs.race_worker import workers_of
from specviz.views.run_view import RunView

pytestmark = pytest.mark.slow       # an app server in a subprocess (~11 s to start): CI runs it, the edit loop does not

STATS = RunView._fields.index("stats")     # the Run endpoint's outputs: the run's views, in RunView's order
CHAT = "Chat template"
EARLY_EXIT = "Early exit (target's first layers)"
PROMPT_LOOKUP = "Prompt lookup (n-gram)"


@pytest.fixture(scope="module")
def client():
    from gradio_client import Client

    with running_app(tiny=True) as app:
        yield Client(app.url, verbose=False)


def run_inputs(**changes):
    values = dict(prompt="the cat sat on the mat and the cat sat on the", target="", drafter=PROMPT_LOOKUP,
                  draft_model="", exit_layer=1, k=4, dynamic_k=False, temperature=0.0, top_p=1.0, top_k=0,
                  max_new_tokens=16, seed=0, prompt_format=CHAT, branch=1)
    values.update(changes)
    return list(values.values())


def test_the_api_lists_exactly_the_public_endpoints(client):
    named = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert named == {"/run", "/compare", "/sweep", "/load", "/teach", "/export",
                     "/race_speculative_decoding", "/compare_configurations", "/load_sweep", "/read_recording"}


def answer(client, *args, api_name, output=0):
    """The text a refused call shows: our message in an output, or Gradio's own refusal of a value
    outside a slider's range (it checks those before the handler runs)."""
    from gradio_client.exceptions import AppError

    try:
        result = client.predict(*args, api_name=api_name)
    except AppError as error:
        return str(error)
    return result[output].replace("&#x27;", "'")


def test_run_through_the_api(client):
    result = client.predict(*run_inputs(), api_name="/run")
    assert "Finished" in result[STATS] and "data-verdict" in result[0]


SUMMARY = -1        # /run's and /compare's last output: the summary as named JSON (docs/api.md)


def test_the_documented_example_runs(client, capsys):
    """docs/api.md's gradio_client example, as it is written, against this server."""
    import re

    docs = (Path(__file__).resolve().parent.parent / "docs" / "api.md").read_text()
    example = re.search(r"## From Python.*?```python\n(.*?)```", docs, re.S).group(1)
    exec(example.replace("http://127.0.0.1:7860/", client.src), {})    # noqa: S102 - our own docs
    printed = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("Loaded as API")]
    assert re.match(r"\d+\.\d\dx \(95% interval \d+\.\d\d-\d+\.\d\dx, thread CPU time, ", printed[0]), printed
    assert "Measured at" in printed[1] or "Shared race" in printed[1] or "Replay" in printed[1]


def test_run_and_compare_return_named_fields(client):
    # As docs/api.md shows it: the speedup, its 95% interval and the clock by name.
    from gradio_client import Client

    own = Client(client.src, verbose=False)
    data = own.predict(*run_inputs(prompt="the dog sat on the mat and the dog sat on the", max_new_tokens=24),
                       api_name="/run")[SUMMARY]
    summary = data["summary"]
    assert summary["speedup_low"] <= summary["speedup"] <= summary["speedup_high"]
    assert summary["clock"] == "thread CPU time" and summary["compared_basis"] and summary["tokens"] == 24
    assert data["text"] and data["baseline_text"] and data["measurement"]["replay"] is False
    again = own.predict(*run_inputs(prompt="the dog sat on the mat and the dog sat on the", max_new_tokens=24),
                        api_name="/run")[SUMMARY]
    assert again["measurement"]["replay"] is True and again["measurement"]["shown_to"] == 2
    assert again["summary"] == summary            # the same measurement, said to be a replay
    table = {"headers": ["use", "target", "draft", "k", "dynamic k", "temperature"],
             "data": [[True, "", "ngram", 4, False, 0.0], [True, "", "ngram", 2, False, 0.0]]}
    compared = own.predict("the cat sat on the mat and the cat sat on the", table, 16, 0, CHAT, "This prompt", None, 1,
                           api_name="/compare")[SUMMARY]
    assert [c["config"] for c in compared["configurations"]] == ["ngram k=4", "ngram k=2"]
    for config in compared["configurations"]:
        assert config["speedup_low"] <= config["speedup"] <= config["speedup_high"] and config["clock"]
    assert compared["winner"]


@pytest.mark.parametrize("changes, message", [
    (dict(k=1000), "greater than maximum value 16"),
    (dict(max_new_tokens=100000), "greater than maximum value 256"),
    (dict(temperature=50), "greater than maximum value 2"),
    (dict(seed=2**80), "seed must be a whole number"),
    (dict(target="/etc"), "only runs the preset models"),
    (dict(drafter="Draft model", draft_model="someone/huge-model"), "only runs the preset draft models"),
    (dict(prompt="x" * 5000), "at most 4000"),
    # Values of the wrong type reach the settings' check (Gradio's slider check gave only its generic error).
    (dict(k="abc"), "k (tokens drafted per cycle) must be a whole number from 1 to 16, got 'abc'"),
    (dict(temperature="hot"), "temperature must be a number from 0 to 2, got 'hot'"),
    (dict(seed="x"), "seed must be a whole number"),
    (dict(max_new_tokens=None), "max new tokens must be a whole number from 1 to 256, got None"),
])
def test_run_refuses_out_of_range_values(client, changes, message):
    assert message in answer(client, *run_inputs(**changes), api_name="/run", output=STATS)


@pytest.mark.parametrize("api_name", ["/compare", "/sweep"])
def test_compare_and_sweep_refuse_out_of_range_values(client, api_name):
    table = {"headers": ["use", "target", "draft", "k", "dynamic k", "temperature"],
             "data": [[True, "", "ngram", 1000, False, 0.0]]}
    one = ("This prompt", None, 1)          # the prompt-set controls: one prompt
    assert "Row 1: k (tokens drafted per cycle) must be a whole number from 1 to 16" in \
        answer(client, "the cat sat", table, 16, 0, CHAT, *one, api_name=api_name)
    table["data"] = [[True, "/etc/passwd", "ngram", 4, False, 0.0]]
    assert "only runs the preset models" in answer(client, "the cat sat", table, 16, 0, CHAT, *one, api_name=api_name)
    table["data"] = [[True, "", "ngram", 4, False, 0.0]]
    assert "greater than maximum value 256" in answer(client, "the cat sat", table, 100000, 0, CHAT, *one,
                                                      api_name=api_name)


def test_prompt_sets_in_hosted_mode_are_presets_within_a_budget(client):
    from gradio_client import Client

    other = Client(client.src, verbose=False)        # its own session: nothing left behind for /export
    table = {"headers": ["use", "target", "draft", "k", "dynamic k", "temperature"],
             "data": [[True, "", "ngram", k, False, 0.0] for k in (2, 4, 6, 8)]}
    assert "this hosted demo allows" in answer(other, "", table, 256, 0, CHAT, "Set: examples (15 prompts)", None, 5,
                                               api_name="/compare")
    assert "not in the list of choices" in answer(other, "", table, 16, 0, CHAT, "A file of prompts (upload)", None, 1,
                                                  api_name="/compare")


def test_teach_and_compare_explain_values_of_the_wrong_type(client):
    assert "k (tokens drafted per cycle) must be a whole number from 1 to 16, got 'many'" in answer(
        client, "the cat", EARLY_EXIT, "", 1, "many", 0.5, 0, 16, CHAT, api_name="/teach", output=1)
    table = {"headers": ["use", "target", "draft", "k", "dynamic k", "temperature"],
             "data": [[True, "", "ngram", 4, False, 0.0]]}
    assert "max new tokens must be a whole number" in answer(client, "the cat sat", table, "lots", 0, CHAT,
                                                             "This prompt", None, 1, api_name="/compare")
    assert "rounds must be a whole number from 1 to 5, got 'two'" in answer(
        client, "", table, 16, 0, CHAT, "Set: chat (5 prompts)", None, "two", api_name="/compare")


def test_teach_refuses_out_of_range_values(client):
    assert "greater than maximum value 128" in answer(client, "the cat", EARLY_EXIT, "", 1, 4, 0.5, 0, 100000, CHAT,
                                                      api_name="/teach", output=1)
    assert "only runs the preset draft models" in answer(client, "the cat", "Draft model", "org/x", 1, 4, 0.5, 0, 16,
                                                         CHAT, api_name="/teach", output=1)
    assert "seed must be a whole number" in answer(client, "the cat", EARLY_EXIT, "", 1, 4, 0.5, 2**80, 16, CHAT,
                                                   api_name="/teach", output=1)


def test_export_without_a_comparison_exports_nothing(client):
    assert client.predict(False, api_name="/export") == {"__type__": "update"}   # skip: no files


# ----------------------------------------------------------------------------- cancellation

def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def busy_fraction(pid: int, seconds: float) -> float:
    start = cpu_seconds(pid)
    time.sleep(seconds)
    return (cpu_seconds(pid) - start) / seconds


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_cancelled_teach_run_stops_the_servers_work():
    from gradio_client import Client

    with running_app("slow", tiny=True) as app:
        client = Client(app.url, verbose=False)
        # A warm-up run (loads the models), then three runs, each cancelled once it is decoding:
        # with a handler that ignores the cancel, they would go on decoding side by side.
        client.predict("the cat", EARLY_EXIT, "", 1, 4, 0.8, 0, 8, CHAT, api_name="/teach")
        for _ in range(3):
            job = client.submit("the cat sat on the", EARLY_EXIT, "", 1, 4, 0.8, 0, 128, CHAT, api_name="/teach")
            deadline = time.monotonic() + 30
            while busy_fraction(app.pid, 0.5) < 0.5:
                assert time.monotonic() < deadline, "the run never started"
            job.cancel()
        time.sleep(2.0)             # a cycle in flight, the cancel round trip
        assert busy_fraction(app.pid, 3.0) < 0.15


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs Linux /proc")
def test_a_cancelled_run_ends_its_race_worker():
    # On a CPU each race runs in a forked process of its own: a Run cancelled through the API must end
    # it (the server's own CPU would not show a worker that races on).
    from gradio_client import Client

    with running_app("slow", tiny=True) as app:
        client = Client(app.url, verbose=False)
        client.predict(*run_inputs(max_new_tokens=8), api_name="/run")          # loads the models
        for round_ in range(2):
            job = client.submit(*run_inputs(prompt=f"the cat sat on the mat {round_}", max_new_tokens=256),
                                api_name="/run")
            deadline = time.monotonic() + 30
            while not workers_of(app.pid):
                assert time.monotonic() < deadline, "no race worker ever started"
                time.sleep(0.05)
            worker = workers_of(app.pid)[0]
            job.cancel()
            deadline = time.monotonic() + 5         # the race itself would go on for ~10-20 s
            while Path(f"/proc/{worker}").exists() and Path(f"/proc/{worker}/stat").read_text().split()[2] != "Z":
                assert time.monotonic() < deadline, "the race worker went on after the cancel"
                time.sleep(0.1)
