"""Wall-clock bounds that hold on a busy machine: the time a thread was ready to run but waited for a
core (Linux's /proc/thread-self/schedstat, second field; 0 where the kernel does not keep it).

CI runs two workers on two cores, and a vLLM server beside them adds processes of its own: a test that
bounds a wall-clock time then measures the machine's load as much as the code. Subtracting the wait
for a core keeps the bound on what the code did (its own work and its own sleeps)."""

from __future__ import annotations

import time
from pathlib import Path

SCHEDSTAT = Path("/proc/thread-self/schedstat")


def waited_for_a_core() -> float:
    """Seconds this thread has so far spent runnable but not running (0.0 where not kept)."""
    try:
        return int(SCHEDSTAT.read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


class Stopwatch:
    """Wall time, CPU time and the wait for a core over a `with` block, all of this thread's process."""

    def __enter__(self) -> Stopwatch:
        self._wall, self._cpu, self._wait = time.monotonic(), time.process_time(), waited_for_a_core()
        return self

    def __exit__(self, *exc) -> None:
        self.wall = time.monotonic() - self._wall
        self.cpu = time.process_time() - self._cpu
        self.waited = waited_for_a_core() - self._wait

    @property
    def on_a_core(self) -> float:
        """The wall time less the wait for a core: what the block took with a core whenever it wanted one."""
        return self.wall - self.waited

    def __repr__(self) -> str:
        return f"wall {self.wall:.1f} s, cpu {self.cpu:.1f} s, waited for a core {self.waited:.1f} s"
