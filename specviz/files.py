"""Reading and writing the files a user names: bounded reads, whole-or-nothing writes.

Every input file (a recording, a prompt set) is read through `read_limited`, which stops after the
limit plus one byte: the limit holds for devices and pipes too (`/dev/zero` reports size 0).
Every output file is written through `write_atomic`: into a temporary file beside the target, then
renamed over it, so a failure (a full disk, an unencodable character, Ctrl-C) leaves an existing
file as it was and never leaves half a file. `check_paths` refuses, before any work, an output
that would overwrite an input or another output of the same command.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from .errors import SpecvizError


def megabytes(size: int) -> str:
    return f"{size / (1024 * 1024):g} MB"


def read_limited(path: Path | str, limit: int, what: str = "the file") -> bytes:
    """At most `limit` bytes of `path`, or a SpecvizError saying it is larger (read `limit` + 1 at most)."""
    path = Path(path)
    try:
        with open(path, "rb") as stream:
            data = stream.read(limit + 1)
    except IsADirectoryError:
        raise SpecvizError(f"{path} is a folder, not {what}.") from None
    except OSError as error:
        raise SpecvizError(f"Cannot read {path}: {error.strerror or error}.") from None
    if len(data) > limit:
        raise SpecvizError(f"{path} is larger than {megabytes(limit)}, too large for {what}.")
    return data


def is_stream(path: Path) -> bool:
    """A device or a pipe (/dev/stdout, /dev/null, a FIFO): it cannot be replaced by a rename (and
    /dev/null must never be), so it is written to in place."""
    return path.exists() and not path.is_file() and not path.is_dir()


def write_atomic(path: Path | str, data: str | bytes) -> Path:
    """Write `data` (text as UTF-8) to `path` whole or not at all. Through a symbolic link, the file
    it names is replaced and the link kept; a device or a pipe is written to in place."""
    path = Path(path)
    try:
        payload = data.encode("utf-8") if isinstance(data, str) else data
    except UnicodeEncodeError as error:
        raise SpecvizError(f"Cannot write {path}: the text holds a character UTF-8 cannot encode "
                           f"({error.reason}); nothing was written.") from None
    if is_stream(path):
        return _write_in_place(path, payload)
    target = path.resolve() if path.is_symlink() else path
    temporary = None
    try:
        descriptor, temporary = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".partial",
                                                 dir=target.parent if str(target.parent) else ".")
        with os.fdopen(descriptor, "wb") as out:
            out.write(payload)
            out.flush()
            os.fsync(out.fileno())
        if target.exists():
            # Keep the permissions of the file being replaced (mkstemp makes it private).
            os.chmod(temporary, target.stat().st_mode & 0o7777)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, target)
        temporary = None
    except OSError as error:
        kept = "the existing file is unchanged" if target.exists() else "nothing was written"
        raise SpecvizError(f"Cannot write {path}: {_reason(error)}; {kept}.") from None
    finally:
        if temporary is not None:
            try:
                os.unlink(temporary)
            except OSError:
                pass
    return path


def _write_in_place(path: Path, payload: bytes) -> Path:
    try:
        with open(path, "wb") as out:
            out.write(payload)
    except OSError as error:
        reason = "the device is full" if error.errno == errno.ENOSPC else _reason(error)
        raise SpecvizError(f"Cannot write {path}: {reason}. Choose another output path.") from None
    return path


def _reason(error: OSError) -> str:
    return "the disk is full" if error.errno == errno.ENOSPC else (error.strerror or str(error))


def _same(a: Path, b: Path) -> bool:
    try:
        return a.exists() and b.exists() and os.path.samefile(a, b)
    except OSError:
        return False


def check_paths(inputs: Iterable[Path | str | None], outputs: Iterable[tuple[str, Path | str | None]]) -> None:
    """Refuse an output (named by its flag) that is one of the inputs or another output's path."""
    inputs = [Path(p) for p in inputs if p is not None]
    seen: list[tuple[str, Path]] = []
    for flag, output in outputs:
        if output is None:
            continue
        output = Path(output)
        for path in inputs:
            if output.resolve() == path.resolve() or _same(output, path):
                raise SpecvizError(f"{flag} {output} is an input of this command: writing it would destroy it. "
                                   "Choose another output path.")
        for other_flag, other in seen:
            if output.resolve() == other.resolve() or _same(output, other):
                raise SpecvizError(f"{flag} and {other_flag} name the same file ({output}): one would overwrite "
                                   "the other. Give each its own path.")
        seen.append((flag, output))
