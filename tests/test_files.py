"""Bounded reads and whole-or-nothing writes (specviz.files)."""

import os

import pytest

from specviz.errors import SpecvizError
from specviz.files import check_paths, read_limited, write_atomic


def test_a_device_is_read_only_up_to_the_limit():
    # /dev/zero reports size 0 and never ends: the read must stop at limit + 1 bytes.
    with pytest.raises(SpecvizError, match="larger than"):
        read_limited("/dev/zero", 1024, "a recording")


def test_a_file_within_the_limit_reads_whole(tmp_path):
    path = tmp_path / "a.json"
    path.write_bytes(b"x" * 1024)
    assert read_limited(path, 1024) == b"x" * 1024
    with pytest.raises(SpecvizError, match="larger than"):
        read_limited(path, 1023)


def test_a_folder_or_missing_file_is_named(tmp_path):
    with pytest.raises(SpecvizError, match="is a folder"):
        read_limited(tmp_path, 10)
    with pytest.raises(SpecvizError, match="Cannot read"):
        read_limited(tmp_path / "missing", 10)


def test_an_unencodable_text_leaves_the_existing_file_as_it_was(tmp_path):
    path = tmp_path / "out.json"
    path.write_text("precious")
    with pytest.raises(SpecvizError, match="UTF-8"):
        write_atomic(path, "bad \udc80 surrogate")
    assert path.read_text() == "precious"
    assert os.listdir(tmp_path) == ["out.json"]        # no temporary left behind


def test_a_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("precious")

    def full_disk(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(SpecvizError, match="disk is full; the existing file is unchanged"):
        write_atomic(path, "new " * 1000)
    assert path.read_text() == "precious"
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_write_replaces_the_file_and_keeps_its_mode(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    path.chmod(0o640)
    write_atomic(path, "new")
    assert path.read_text() == "new"
    assert path.stat().st_mode & 0o777 == 0o640


def test_an_output_on_an_input_or_on_another_output_is_refused(tmp_path):
    recording = tmp_path / "mine.json"
    recording.write_text("{}")
    with pytest.raises(SpecvizError, match="is an input"):
        check_paths([recording], [("-o", tmp_path / "." / "mine.json")])
    with pytest.raises(SpecvizError, match="name the same file"):
        check_paths([], [("--json", tmp_path / "x.json"), ("--record", tmp_path / "x.json")])
    check_paths([recording], [("-o", tmp_path / "report.html"), ("--json", None)])


def test_a_device_is_written_in_place_not_replaced(tmp_path):
    # A rename over /dev/null (as root) would replace the device with a regular file.
    write_atomic("/dev/null", "discarded")
    assert not os.path.isfile("/dev/null")
    with pytest.raises(SpecvizError, match="device is full"):
        write_atomic("/dev/full", "x")


def test_a_symbolic_link_keeps_pointing_at_the_rewritten_file(tmp_path):
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
