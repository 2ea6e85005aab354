"""The command line against a hostile file or a hostile moment (issue 21): recorded text cannot
drive the terminal, plain output marks every verdict, outputs are written whole or not at all and
never over an input, Ctrl-C keeps finished work, endless inputs end in one message, and no
message promises a log that does not exist."""

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import default_sigint, make_llama
from test_cli import folder, no_loading, one_error_line  # noqa: F401 - fixtures
from tiny_pair import PROMPT, WORDS
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from specviz.catalog import read_prompt_file
from specviz.cli import entry
from specviz.core.events import RESAMPLED
from specviz.errors import SpecvizError, user_message
from specviz.runs import execute
from specviz.runs import recording as rec
from specviz.settings import RunSettings

ROOT = Path(__file__).resolve().parent.parent
# Every character a terminal may act on, but newline and tab: C0, DEL and C1.
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
CLEAR_SCREEN, TITLE, CLIPBOARD, CSI = "\x1b[2J", "\x1b]0;owned\x07", "\x1b]52;c;aGVsbG8=\x07", "\x9b31m"


@pytest.fixture(scope="module")
def live(tiny):
    """A greedy run with a baseline and, somewhere, a rejected draft and a resampled correction."""
    settings = RunSettings(target="tiny", draft="ngram", k=4, max_new_tokens=32, chat=False, fixed_k=True)
    run = execute(settings, PROMPT, tiny.loader(settings), baseline=True)
    assert any(c.num_accepted < len(c.drafted) for c in run.cycles)
    return run


def fresh_record(run) -> dict:
    """The run's recording as parsed JSON: edits to it cannot reach the run (it shares lists)."""
    return json.loads(json.dumps(rec.recording([run])))


def save(record: dict, path: Path) -> Path:
    path.write_text(json.dumps(record, ensure_ascii=False), encoding="utf-8")
    return path


def hostile_record(live) -> dict:
    """The run's recording with escape sequences in token texts (an accepted and a rejected draft,
    a correction), in its label and in its model name."""
    record = fresh_record(live)
    recorded = record["runs"][0]
    rejecting = next(c for c in recorded["cycles"] if c["num_accepted"] < len(c["drafted"]))
    rejecting["drafted_text"][rejecting["num_accepted"]] = CLEAR_SCREEN + "rejected"
    if rejecting["num_accepted"]:
        rejecting["drafted_text"][0] = TITLE + "accepted"
    rejecting["correction_text"] = CLIPBOARD + "corrected" + CSI
    recorded["label"] = TITLE + "label"
    recorded["target"]["name"] = CLEAR_SCREEN + "target"
    return record


# ----------------------------------------------------------------------------- terminal escapes

@pytest.mark.parametrize("flags, terminal", [(["--no-color"], False), ([], False), ([], True), (["--plain"], True)])
def test_recorded_escape_sequences_never_reach_the_terminal(live, tmp_path, capsys, monkeypatch, flags, terminal):
    if terminal:   # rich then writes colour, as on a real terminal
        monkeypatch.setenv("FORCE_COLOR", "1")
    path = save(hostile_record(live), tmp_path / "hostile.json")
    assert entry(["replay", str(path), "--fast", *flags]) == 0
    out, err = capsys.readouterr()
    printed = out + err
    for sequence in (CLEAR_SCREEN, TITLE, CLIPBOARD, CSI, "\x1b]", "\x07", "\x9b"):
        assert sequence not in printed
    if not terminal:
        assert not CONTROL.search(printed.replace("\n", "").replace("\t", ""))
    elif "--plain" not in flags:
        assert "\x1b[31m" in out or "\x1b[9;31m" in out      # rich did colour the rejected drafts
    # Made visible, not silently dropped: ESC shows as U+241B, CSI as its escape.
    assert "\u241b[2Jrejected" in printed or "--plain" in flags
    assert "corrected\\x9b31m" in printed and "\u241b[2Jtarget" in printed


def test_model_text_is_made_printable_in_run(tmp_path, capsys):
    # A model whose every word carries a window-title sequence: whatever it generates carries it.
    words = WORDS[:2] + [word + TITLE for word in WORDS[2:]]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<eos>")
    model = make_llama(0, layers=2, vocab=len(words))      # no end-of-sequence: it writes all 8 tokens
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    for flags in ([], ["--plain"]):
        assert entry(["run", "--target", str(tmp_path / "model"), "--dtype", "float32", "--raw", "--max-new-tokens",
                      "8", *flags, PROMPT]) == 0
        out, err = capsys.readouterr()
        assert "\x1b" not in out + err and "\x07" not in out + err and "\u241b]0;owned\u2407" in out


@pytest.mark.slow
def test_an_undecodable_file_name_is_shown_not_fatal(live, tmp_path):
    # Bytes that are not UTF-8 in argv arrive as lone surrogates, which a strict UTF-8 stdout cannot
    # encode (and which a lenient one would write back as raw bytes, such as a C1 \x9b).
    path = rec.save(tmp_path / "run.json", [live])
    done = subprocess.run([sys.executable, "-m", "specviz", "report", str(path), "-o",
                           os.fsencode(tmp_path) + b"/caf\xe9.html"], cwd=ROOT, capture_output=True, timeout=120,
                          env=dict(os.environ, HF_HUB_OFFLINE="1", LC_ALL="C.UTF-8", PYTHONIOENCODING="utf-8"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.decode().startswith(f"wrote {tmp_path}/caf\ufffd.html (")
    assert (tmp_path / os.fsdecode(b"caf\xe9.html")).exists()


# ----------------------------------------------------------------------------- plain output

def expected_marked(cycle, text) -> str:
    """One chain cycle as plain text shows it: accepted drafts, [-rejected-], then the target's token."""
    accepted = "".join(text.drafted[: cycle.num_accepted])
    rejected = "".join(f"[-{t}-]" for t in text.drafted[cycle.num_accepted:])
    opening, closing = ("{+", "+}") if cycle.correction_kind == RESAMPLED else ("{*", "*}")
    return accepted + rejected + (opening + text.correction + closing if cycle.correction is not None else "")


def test_plain_output_marks_every_verdict(live, tmp_path, capsys):
    path = rec.save(tmp_path / "run.json", [live])
    assert entry(["replay", str(path), "--fast"]) == 0        # no terminal: plain text
    out = capsys.readouterr().out
    tokens = "|".join(expected_marked(c, t) for c, t in zip(live.cycles, live.texts))
    assert out.startswith(tokens + "\n")
    assert "[-" in tokens and ("{+" in tokens or "{*" in tokens)
    assert "[-rejected draft-]" in out and "{+target's correction+}" in out and "{*bonus token*}" in out


def test_plain_flag_prints_exactly_the_generated_text(live, tmp_path, capsys):
    path = rec.save(tmp_path / "run.json", [live])
    assert entry(["replay", str(path), "--fast", "--plain"]) == 0
    out, err = capsys.readouterr()
    # The text as its tokens were recorded (the live run decoded all its tokens at once instead).
    assert out == rec.load(path).runs[0].text == "".join(live.emitted_texts())
    assert "tokens per target pass" in err and "legend" not in out


@pytest.mark.slow
def test_a_reader_that_stops_reading_ends_the_replay_quietly(live, tmp_path):
    record = fresh_record(live)
    for cycle in record["runs"][0]["cycles"]:      # 0.2 s per cycle: the reader leaves mid-replay
        cycle["draft_seconds"], cycle["verify_seconds"] = 0.0, 0.2
    path = save(record, tmp_path / "slow.json")
    command = [sys.executable, "-m", "specviz", "replay", str(path), "--plain"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               env=dict(os.environ, HF_HUB_OFFLINE="1"))
    process.stdout.read(1)          # `| head -c 1`: read a little, then go away
    process.stdout.close()
    assert process.wait(timeout=120) == 1
    err = process.stderr.read()
    assert b"Traceback" not in err and b"error:" not in err and b"Exception ignored" not in err


def test_run_plain_prints_exactly_the_generated_text(folder, tmp_path, capsys):  # noqa: F811
    out_json = tmp_path / "run.json"
    assert entry(["run", "--target", folder, "--dtype", "float32", "--raw", "--max-new-tokens", "16", "--plain",
                  "--json", str(out_json), PROMPT]) == 0
    out, err = capsys.readouterr()
    written = json.loads(out_json.read_text())
    # The tokens as they read after the prompt (what `replay --plain` prints of its recording): with
    # this word-level tokenizer the first one has a space the text decoded alone does not.
    in_context = "".join(text for cycle in written["cycles"]
                         for text in cycle["drafted_text"][: cycle["num_accepted"]] + [cycle["correction_text"]])
    assert out == in_context and out.lstrip() == written["text"]
    assert "acceptance" in err and f"wrote {out_json}" in err


# ----------------------------------------------------------------------------- paths and writes

def test_an_output_on_an_input_is_refused_before_any_work(live, tmp_path, capsys, no_loading):  # noqa: F811
    mine = rec.save(tmp_path / "mine.json", [live])
    before = mine.read_bytes()
    line = one_error_line(capsys, entry(["report", str(mine), "-o", str(mine)]))
    assert "is an input of this command" in line and mine.read_bytes() == before
    link = tmp_path / "link.html"
    link.symlink_to(mine)
    assert "is an input" in one_error_line(capsys, entry(["report", str(mine), "-o", str(link)]))
    assert mine.read_bytes() == before

    same = str(tmp_path / "x.json")
    line = one_error_line(capsys, entry(["run", "--json", same, "--record", same, PROMPT]))
    assert "--record and --json name the same file" in line
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("one prompt\n")
    line = one_error_line(capsys, entry(["compare", "--prompts", str(prompts), "--json", str(prompts)]))
    assert "--json" in line and "is an input" in line and prompts.read_text() == "one prompt\n"
    line = one_error_line(capsys, entry(["compare", "--prompts", str(prompts), "--export", str(tmp_path / "out"),
                                         "--json", str(tmp_path / "out" / "summary.json")]))
    assert "name the same file" in line
    line = one_error_line(capsys, entry(["bench", "--target", "tiny", "--prompts", str(prompts), "--markdown",
                                         str(prompts)]))
    assert "--markdown" in line and "is an input" in line


def test_a_surrogate_in_a_recording_is_refused_and_the_old_report_kept(live, tmp_path, capsys):
    # A lone surrogate is valid JSON ("\udcff") but no UTF-8 file can hold it: refused at load,
    # before anything is written (it used to truncate the existing -o file to 0 bytes).
    record = fresh_record(live)
    record["environment"]["device_name"] = "\udcff"
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(record), encoding="utf-8")
    out = tmp_path / "report.html"
    out.write_text("the previous report")
    line = one_error_line(capsys, entry(["report", str(path), "-o", str(out)]))
    assert line.startswith("error: ") and "device_name" in line
    assert out.read_text() == "the previous report"


def test_a_device_output_is_written_in_place(live, tmp_path, capsys):
    path = rec.save(tmp_path / "run.json", [live])
    # /dev/full: the disk-full error, as one line; /dev/null: written, and still a device.
    line = one_error_line(capsys, entry(["report", str(path), "-o", "/dev/full"]))
    assert line == "error: Cannot write /dev/full: the device is full. Choose another output path."
    assert entry(["report", str(path), "-o", "/dev/null"]) == 0
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode) and stat.S_ISCHR(os.stat("/dev/full").st_mode)


@pytest.fixture
def full_disk(tmp_path):
    """A 256 KiB tmpfs, mounted for the test (root only), with an existing report.html on it."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)],
                                           capture_output=True).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=False)


def test_a_full_disk_leaves_the_existing_file_as_it_was(live, full_disk, tmp_path, capsys):
    path = rec.save(tmp_path / "run.json", [live])
    existing = full_disk / "report.html"
    existing.write_text("the previous report")
    line = one_error_line(capsys, entry(["report", str(path), "-o", str(existing)]))   # a report is > 1 MB
    assert "the disk is full; the existing file is unchanged" in line
    assert existing.read_text() == "the previous report"
    assert [p.name for p in full_disk.iterdir()] == ["report.html"]          # no partial file left


# ----------------------------------------------------------------------------- endless input

@pytest.mark.parametrize("argv, what", [(["replay", "/dev/zero"], "a recording"),
                                        (["report", "/dev/zero", "-o", "REPORT"], "a recording"),
                                        (["compare", "--prompts", "/dev/zero"], "a prompt file"),
                                        (["bench", "--target", "tiny", "--prompts", "/dev/zero"], "a prompt set")])
def test_an_endless_input_ends_in_one_line(no_loading, capsys, tmp_path, argv, what):  # noqa: F811
    argv = [str(tmp_path / "r.html") if a == "REPORT" else a for a in argv]
    started = time.monotonic()
    line = one_error_line(capsys, entry(argv))
    assert line == f"error: /dev/zero is larger than 16 MB, too large for {what}."
    assert time.monotonic() - started < 30      # a 16 MB read, not an endless one (under load)


def test_a_json_prompt_is_limited_by_its_length_not_its_line(tmp_path):
    path = tmp_path / "long.jsonl"
    path.write_text(json.dumps({"prompt": "x" * 19_999, "category": "long"}) + "\n")
    assert len(read_prompt_file(path)[0].prompt) == 19_999
    path.write_text(json.dumps({"prompt": "x" * 20_001}) + "\n")
    with pytest.raises(SpecvizError, match="line 1: a prompt of 20001 characters"):
        read_prompt_file(path)


# ----------------------------------------------------------------------------- times and messages

def test_a_recording_that_claims_forever_is_refused_and_a_long_one_needs_fast(live, tmp_path, capsys):
    record = fresh_record(live)
    record["runs"][0]["cycles"][0]["verify_seconds"] = 1e300
    path = save(record, tmp_path / "forever.json")
    for argv in (["replay", str(path)], ["replay", str(path), "--fast"]):
        line = one_error_line(capsys, entry(argv))
        assert line.startswith("error: forever.json: ") and "at most 600 s" in line
    # Within the per-event cap, a replay that would wait more than an hour needs --fast or --speed.
    record = fresh_record(live)
    for cycle in record["runs"][0]["cycles"]:
        cycle["verify_seconds"] = 590.0
    path = save(record, tmp_path / "long.json")
    line = one_error_line(capsys, entry(["replay", str(path)]))
    assert line.startswith("error: long.json: played at --speed 1 it would take ") and "Add --fast" in line
    assert "longer than any clock counts" in one_error_line(capsys, entry(["replay", str(path), "--speed", "1e-320"]))
    assert entry(["replay", str(path), "--fast", "--no-color"]) == 0
    assert "tokens per target pass" in capsys.readouterr().out
    assert entry(["report", str(path), "-o", str(tmp_path / "long.html")]) == 0


def test_an_unexpected_error_promises_no_log():
    line = user_message(KeyError("x"), details="Run again with SPECVIZ_DEBUG=1 for the traceback.")
    assert line == "Unexpected error (KeyError: 'x'). Run again with SPECVIZ_DEBUG=1 for the traceback."
    assert user_message(KeyError("x")).endswith("Details are in the server's log.")   # the app keeps one


# ----------------------------------------------------------------------------- Ctrl-C

@pytest.mark.slow
def test_ctrl_c_keeps_the_finished_runs_of_a_prompt_set(folder, tmp_path):  # noqa: F811
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{PROMPT} {i}\n" for i in range(60)))
    out_json, export = tmp_path / "rows.json", tmp_path / "export"
    command = [sys.executable, "-m", "specviz", "compare", "--target", folder, "--dtype", "float32", "--raw",
               "--max-new-tokens", "24", "--prompts", str(prompts), "--json", str(out_json), "--export", str(export)]
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, HF_HUB_OFFLINE="1"), preexec_fn=default_sigint)
    seen = []
    for line in process.stderr:                 # progress: "[N of 60 runs done, ...] ..."
        seen.append(line)
        if line.startswith("[2 of 60 runs done"):
            process.send_signal(signal.SIGINT)
            break
    rest = process.stderr.read()
    assert process.wait(timeout=120) == 130, "".join(seen) + rest
    assert process.stdout.read() == ""
    last = rest.strip().splitlines()[-1]
    finished = int(re.match(r"error: cancelled after (\d+) of 60 runs; the finished runs are in ", last).group(1))
    assert finished >= 2 and last.endswith(f"{out_json} and 3 files in {export}.")
    assert len(json.loads(out_json.read_text())["rows"]) == finished
    assert len((export / "rows.csv").read_text().splitlines()) == finished + 1
