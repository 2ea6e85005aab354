"""The one error type users see, and the one translation of any exception into a message.

`SpecvizError` is raised for whatever the user asked for that cannot be done, or that the machine
refused: bad settings, a model that does not load, mismatched tokenizers, a prompt longer than the
context, an unwritable output path, out of memory. Its text is the whole message, written for the
person at the keyboard. `user_message` turns any exception into such a text; the app and the command
line both show exactly that, and only unexpected errors carry a traceback: the app writes it to
the server's log, the command line prints it when SPECVIZ_DEBUG is set (it has no log file), so
each says where the details are with `details`.
"""

from __future__ import annotations

import sys


class SpecvizError(Exception):
    """A request that cannot be done; the message says why and what to do instead."""


OUT_OF_MEMORY = ("Out of memory on the device. Try fewer new tokens, a shorter prompt, a smaller model pair "
                 "or dtype bfloat16.")


# torch is looked up, not imported: an out-of-memory error from torch can only come once torch is
# loaded, and the command line's replay, report and engine commands never load it.

def is_out_of_memory(exc: BaseException) -> bool:
    torch = sys.modules.get("torch")
    return ((torch is not None and isinstance(exc, torch.OutOfMemoryError))
            or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()))


def free_device_memory() -> None:
    """After an out-of-memory error: hand the cached blocks back so the next run can start."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()


def expected(exc: BaseException) -> bool:
    """Whether an exception is one a user can cause (no traceback needed in the log)."""
    return isinstance(exc, SpecvizError) or is_out_of_memory(exc)


# The app logs every unexpected error's traceback (`ui.common.failure`).
APP_DETAILS = "Details are in the server's log."


def user_message(exc: BaseException, details: str = APP_DETAILS) -> str:
    """The text shown for a failed run; `details` says where an unexpected error's traceback is.
    Frees device memory after an out-of-memory error."""
    if isinstance(exc, SpecvizError):
        return str(exc)
    if is_out_of_memory(exc):
        free_device_memory()
        return OUT_OF_MEMORY
    return f"Unexpected error ({type(exc).__name__}: {exc}). {details}"
