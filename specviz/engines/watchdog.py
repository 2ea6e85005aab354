"""The server's keeper, run as its own small process: `python watchdog.py LOG CMD...`.

It starts CMD (the vLLM server) in a new session, so that the server, its engine core and its
workers share one process group, and then waits for either of two things:
- its standard input reaches end of file: specviz closed the pipe (stop) or died, however it died,
  SIGKILL included (the kernel closes a dead process's pipes): the whole group gets SIGTERM, then
  SIGKILL after GRACE seconds;
- the server exits by itself: whatever it left in its group is killed, and the watchdog exits with
  the server's code.

Why not `prctl(PR_SET_PDEATHSIG)` on the server alone: vLLM's API server spawns an engine core that
spawns a worker, and a SIGKILLed API server leaves both running (measured here); the death signal
also follows the thread that started the child, and Gradio starts work on threads that come and go.
The server still gets PR_SET_PDEATHSIG (SIGTERM) with this watchdog as its parent, whose one thread
lives as long as it does: should the watchdog itself be killed, the API server shuts its engine down.

Standard library only: this file runs under specviz's interpreter without importing specviz.
"""

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time

GRACE = 5.0         # seconds between SIGTERM and SIGKILL of the server's group (multiprocessing's
                    # resource tracker ignores SIGTERM: it always takes the SIGKILL)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # In the child between fork and exec: the server gets SIGTERM when this watchdog dies.
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):   # not Linux: the pipe alone keeps the promise
        pass


def _kill_group(pgid: int, server: subprocess.Popen) -> None:
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + GRACE
    while time.monotonic() < deadline:
        server.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def main() -> int:
    log_path, command = sys.argv[1], sys.argv[2:]
    signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is specviz's to handle; it then closes the pipe
    with open(log_path, "ab") as log:
        server = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True,
                                  preexec_fn=_die_with_parent if sys.platform.startswith("linux") else None)
    print(server.pid, flush=True)
    stopping = threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.buffer.read()
        stopping.set()
        _kill_group(server.pid, server)

    threading.Thread(target=wait_for_eof, daemon=True).start()
    code = server.wait()
    if not stopping.is_set():   # the server ended by itself: nothing of it may stay behind
        try:
            os.killpg(server.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    else:
        # Wait for the group to be gone (the thread may still be between SIGTERM and SIGKILL).
        for _ in range(int(GRACE * 10) + 20):
            try:
                os.killpg(server.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
