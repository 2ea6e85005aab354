"""`python -m specviz run` on a tiny model saved to a folder: coloured output, JSON, baseline, errors."""

import json
import subprocess
import sys

import pytest

from specviz.cli import entry
from tiny_pair import PROMPT, tiny_tokenizer
from conftest import make_llama


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    model = make_llama(0, layers=4, vocab=len(tokenizer), eos=tokenizer.eos_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


def test_run_writes_json_with_baseline(folder, tmp_path, capsys):
    out = tmp_path / "run.json"
    code = entry(["run", "--target", folder, "--draft", "ngram", "--k", "3", "--dtype", "float32",
                  "--max-new-tokens", "24", "--baseline", "--json", str(out), "--raw", PROMPT])
    assert code == 0
    printed = capsys.readouterr().out
    assert "acceptance" in printed and "measured speedup" in printed and "identical: yes" in printed
    data = json.loads(out.read_text())
    assert set(data) == {"config", "text", "cycles", "summary"}
    summary = data["summary"]
    assert summary["identical"] is True and summary["speedup"] > 0
    assert summary["target_parameters"] > 0 and summary["draft"] == "ngram"
    assert sum(len(c["emitted"]) for c in data["cycles"]) == summary["tokens"]
    for c in data["cycles"]:
        assert c["emitted"] == c["drafted"][: c["num_accepted"]] + ([c["correction"]] if c["correction"] is not None else [])
        assert len(c["drafted_text"]) == len(c["drafted"])
        assert c["k"] == 3
    assert data["config"]["k"] == 3 and data["config"]["chat"] is False


def test_run_sampling_and_dynamic_k(folder, capsys):
    code = entry(["run", "--target", folder, "--draft", "self:2", "--dtype", "float32", "--temperature", "0.8",
                  "--top-p", "0.9", "--seed", "1", "--dynamic-k", "--max-new-tokens", "16", "--raw", PROMPT])
    assert code == 0
    assert "tokens per target pass" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--target", "/no/such/folder"], "/no/such/folder"),
    (["--k", "0"], "k"),
    (["--top-p", "2"], "top_p"),
    (["--draft", "self:99"], "between 1 and"),
])
def test_bad_input_is_a_clear_error(folder, capsys, argv, message):
    argv = ["run", "--target", folder, "--dtype", "float32", "--raw", *argv, PROMPT]
    # A later --target overrides the fixture folder.
    code = entry(argv)
    err = capsys.readouterr().err
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert last.startswith("error: ") and message in last and "Traceback" not in err


def test_module_entry_point_help():
    result = subprocess.run([sys.executable, "-m", "specviz", "run", "--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0
    for flag in ("--k", "--dynamic-k", "--temperature", "--top-k", "--top-p", "--seed", "--max-new-tokens",
                 "--dtype", "--device", "--baseline", "--json"):
        assert flag in result.stdout
