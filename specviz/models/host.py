"""The machine a run happens on: what it is (CPU or GPU name, cores, CPU flags), the software that
ran it, and how busy it was.

Everything that reads /proc lives here, as a parser of the file's text (testable with any text) and
a reader that hands it the real file. Where the OS has no such file (macOS, Windows) the readers give
nothing (an empty `CpuInfo`, None) and the description falls back to what `platform` knows.

Why the load matters: every event is timed on its own clock, and on a CPU with one torch thread that
clock is the thread's CPU time. That keeps other processes' work out, but not a busy host's cost: a
virtual CPU's stolen time (the hypervisor running another guest) is counted as the thread's, and a
core shared with other work (caches, memory bandwidth, a hyperthread sibling) runs the thread's own
instructions slower. A run measured at 0.15 s
per pass on a quiet host took 0.68 s per pass while three heavy processes ran. The race interleaves
its two methods event by event, so both pay alike and their ratio stays fair; absolute times and
tokens/s do not. So each run records the load it ran under (`HostLoad`), and the views say when it
was high.
"""

from __future__ import annotations

import math
import os
import platform
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

from ..catalog import VERSION

if TYPE_CHECKING:
    import torch

CPUINFO = "/proc/cpuinfo"
PROC_STAT = "/proc/stat"

# When `HostLoad.busy` says so. A run whose torch threads fill every core reads about 1 per core on a
# quiet host: a quarter more means other work waits for the same cores. Stolen time above 5% is
# time the clock counts but the run never had.
BUSY_LOAD_PER_CPU = 1.25
BUSY_STEAL_SHARE = 0.05


# ----------------------------------------------------------------------------- what the machine is

@dataclass(frozen=True)
class CpuInfo:
    name: str | None                # "model name" (None: the file does not say)
    flags: frozenset[str]           # "flags" (x86) or "Features" (Arm)


def parse_cpuinfo(text: str) -> CpuInfo:
    """The first processor's name and flags from /proc/cpuinfo's text (every core repeats them)."""
    name, flags = None, frozenset()
    for line in text.splitlines():
        if not line.strip() and (name or flags):
            break                   # the end of the first processor's block
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and name is None:
            name = value.strip() or None
        elif key in ("flags", "Features") and not flags:
            flags = frozenset(value.split())
    return CpuInfo(name, flags)


def read_cpuinfo() -> CpuInfo:
    """This machine's `CpuInfo`; empty where there is no /proc/cpuinfo."""
    lines = []
    try:
        with open(CPUINFO, encoding="utf-8", errors="replace") as info:
            for line in info:       # the first block is enough: a 256-core machine's file is ~1 MB
                if not line.strip() and lines:
                    break
                lines.append(line)
    except OSError:
        pass
    return parse_cpuinfo("".join(lines))


def host_description(device: str | torch.device) -> str:
    """One line naming what computes on `device`: 'NVIDIA H200 (CUDA 12.8)', or 'AMD EPYC, 2 cores,
    1 torch thread' (the thread count decides which clock times a CPU run, and how fast it is)."""
    import torch     # here: reading a recording (which holds this line) needs no torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})"
    name = read_cpuinfo().name or platform.processor() or platform.machine() or "unknown CPU"
    threads = torch.get_num_threads()
    return f"{name}, {os.cpu_count()} cores, {threads} torch thread{'s' if threads != 1 else ''}"


def environment(device: str | torch.device) -> dict:
    """The machine and the software versions, as recorded with `--json` output and recordings, and
    the host's 1-minute load average when it is written (each run's summary has its own `HostLoad`)."""
    import torch
    import transformers

    return {"device_name": host_description(device), "torch": torch.__version__,
            "transformers": transformers.__version__, "specviz": VERSION, "torch_threads": torch.get_num_threads(),
            "host_load_average": load_average(), "host_cpus": os.cpu_count()}


def client_environment() -> dict:
    """The machine a client of an engine's server runs on (it runs no model): its CPU, the installed
    versions (read from the package metadata: torch is not imported), the 1-minute load average."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    name = read_cpuinfo().name or platform.processor() or platform.machine() or "unknown CPU"
    return {"device_name": f"{name}, {os.cpu_count()} cores", "torch": installed("torch"),
            "transformers": installed("transformers"), "specviz": VERSION,
            "host_load_average": load_average(), "host_cpus": os.cpu_count()}


# ----------------------------------------------------------------------------- how busy it is

@dataclass(frozen=True)
class CpuTimes:
    """The machine-wide CPU time counters of /proc/stat's "cpu" line, in clock ticks since boot."""
    total: int
    steal: int


def parse_proc_stat(text: str) -> CpuTimes | None:
    """The "cpu" line of /proc/stat's text: user nice system idle iowait irq softirq steal guest
    guest_nice. Guest time is also counted in user and nice, so it is left out of the total. None
    when there is no such line or it has no steal column (kernels before 2.6.11)."""
    for line in text.splitlines():
        fields = line.split()
        if fields and fields[0] == "cpu":
            try:
                ticks = [int(value) for value in fields[1:9]]
            except ValueError:
                return None
            return CpuTimes(total=sum(ticks), steal=ticks[7]) if len(ticks) == 8 else None
    return None


def read_cpu_times() -> CpuTimes | None:
    try:
        with open(PROC_STAT, encoding="ascii", errors="replace") as stat:
            return parse_proc_stat(stat.readline())     # the "cpu" line comes first
    except OSError:
        return None


def steal_share(start: CpuTimes | None, end: CpuTimes | None) -> float | None:
    """The share of all CPU time between two samples that the hypervisor gave to other guests."""
    if start is None or end is None or end.total <= start.total:
        return None
    return (end.steal - start.steal) / (end.total - start.total)


def load_average() -> float | None:
    """The 1-minute load average (runnable and waiting tasks), None where the OS has none."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):   # AttributeError: Windows has no getloadavg
        return None


@dataclass(frozen=True)
class HostLoad:
    """How busy the host was while a run was timed. Busy means other work (another process, or
    another virtual machine on the same physical cores) competed for its CPUs, so absolute times are
    inflated (a race's ratio stays fair: both methods paid alike)."""
    load_average: float | None      # 1-minute load average when the run ended (the run's own threads count too)
    cpus: int                       # logical CPUs the OS reports
    steal_share: float | None       # share of CPU time stolen by the hypervisor over the run; None: not
                                    # reported, or the run was shorter than one clock tick

    @classmethod
    def since(cls, start: CpuTimes | None) -> HostLoad:
        """The load from the sample `start` (`read_cpu_times()` when the run started) to now."""
        return cls(load_average=load_average(), cpus=os.cpu_count() or 1,
                   steal_share=steal_share(start, read_cpu_times()))

    @property
    def busy(self) -> bool:
        overloaded = self.load_average is not None and self.load_average > BUSY_LOAD_PER_CPU * self.cpus
        stolen = self.steal_share is not None and self.steal_share >= BUSY_STEAL_SHARE
        return overloaded or stolen

    def to_dict(self) -> dict:
        """Prefixed keys, for a run's summary (a flat dict of numbers)."""
        return {f"host_{name}": value for name, value in asdict(self).items()}

    @classmethod
    def from_dict(cls, summary) -> HostLoad | None:
        """The load `to_dict` wrote into a (recorded) summary; None when it has none (files written
        before the load was recorded). ValueError for values no host reports."""
        if not isinstance(summary, dict) or "host_cpus" not in summary:
            return None
        cpus, load, steal = summary["host_cpus"], summary.get("host_load_average"), summary.get("host_steal_share")
        if not (type(cpus) is int and cpus >= 1 and _number_or_none(load, 0.0, math.inf)
                and _number_or_none(steal, 0.0, 1.0)):
            raise ValueError("its host load is not a load a host reports")
        return cls(load_average=load, cpus=cpus, steal_share=steal)


def _number_or_none(value, low: float, high: float) -> bool:
    return value is None or (type(value) in (int, float) and low <= value <= high and math.isfinite(value))
