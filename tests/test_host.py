"""The host a run happens on (`models.host`): its one description, the load recorded with each run
and recording, the warning a busy host gets; and the package's edges that came with moving them
(one version, no layer importing the package root, one drain helper)."""

import json
import math
import os
from pathlib import Path

import grimp
import pytest
from setuptools.config.pyprojecttoml import read_configuration
from tiny_pair import PROMPT

import specviz
from specviz.errors import SpecvizError
from specviz.models import host
from specviz.models.host import HostLoad, parse_cpuinfo, parse_proc_stat, steal_share
from specviz.runs import execute, last, race
from specviz.runs import recording as rec
from specviz.settings import RunSettings
from specviz.views.prose import busy_host_text, summary_lines
from specviz.views.run_view import RunRenderer

ROOT = Path(__file__).resolve().parent.parent

X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16

processor\t: 1
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9B14
flags\t\t: fpu vme sse2 avx2 avx512f avx512_bf16
"""
ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 48.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32

processor\t: 1
"""
# /proc/stat's first lines at the start and the end of a race: over the race 1000 ticks passed
# (user nice system idle iowait irq softirq steal; guest columns are inside user), 120 of them stolen.
STAT_START = "cpu  1000 0 500 8000 100 0 50 350 0 0\ncpu0 500 0 250 4000 50 0 25 175 0 0\nintr 12345\n"
STAT_END = "cpu  1500 0 600 8300 100 0 30 470 40 0\ncpu0 750 0 300 4150 50 0 15 235 20 0\nintr 12399\n"
#  total 10000 -> 11000 (the 40 guest ticks are in user already), steal 350 -> 470: 12% stolen


def tiny_settings(**changes) -> RunSettings:
    return RunSettings(**{"target": "tiny", "draft": "ngram", "k": 4, "max_new_tokens": 24, "chat": False, **changes})


# ----------------------------------------------------------------------------- the description

def test_cpuinfo_gives_the_first_processors_name_and_flags():
    info = parse_cpuinfo(X86_CPUINFO)
    assert info.name == "AMD EPYC 9B14"
    assert {"avx2", "avx512_bf16"} <= info.flags and "processor" not in info.flags
    arm = parse_cpuinfo(ARM_CPUINFO)                 # Arm: no model name, its flags are "Features"
    assert arm.name is None and "asimd" in arm.flags
    assert parse_cpuinfo("") == host.CpuInfo(None, frozenset())


def test_the_host_description_names_this_cpu_from_cpuinfo(tmp_path, monkeypatch):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(X86_CPUINFO)
    monkeypatch.setattr(host, "CPUINFO", str(cpuinfo))
    description = host.host_description("cpu")
    assert description.startswith("AMD EPYC 9B14, ") and f"{os.cpu_count()} cores" in description
    # The benchmark's hardware line and a recording's device name are this one description.
    assert host.environment("cpu")["device_name"] == description
    from specviz.models import cpu_has_native_bf16
    assert cpu_has_native_bf16()                     # the same file, read for its flags
    monkeypatch.setattr(host, "CPUINFO", str(tmp_path / "absent"))
    assert host.host_description("cpu")              # no /proc/cpuinfo: what `platform` knows


def test_the_benchmark_describes_the_host_the_same_way():
    from test_bench import tiny_setup

    from specviz.runs import bench

    assert bench.describe(tiny_setup("ngram"))["hardware"] == host.host_description("cpu")


# ----------------------------------------------------------------------------- the load

def test_proc_stat_gives_the_steal_share_between_two_samples():
    start, end = parse_proc_stat(STAT_START), parse_proc_stat(STAT_END)
    assert (start.total, start.steal) == (10000, 350)
    assert steal_share(start, end) == pytest.approx(0.12)
    assert steal_share(start, None) is None and steal_share(end, end) is None
    assert parse_proc_stat("cpu  1 2 3 4 5 6 7\n") is None        # a kernel with no steal column
    assert parse_proc_stat("intr 1 2\n") is None


def test_every_run_records_the_hosts_load_in_its_summary(tiny):
    settings = tiny_settings()
    run = execute(settings, PROMPT, tiny.loader(settings), baseline=True)
    load = run.host_load
    # This machine is Linux: both the load average and the steal column are reported.
    assert isinstance(load.load_average, float) and load.load_average >= 0
    assert isinstance(load.steal_share, float) and 0 <= load.steal_share <= 1
    assert load.cpus == os.cpu_count()
    summary = run.summary()
    assert (summary["host_load_average"], summary["host_cpus"], summary["host_steal_share"]) == (
        load.load_average, load.cpus, load.steal_share)
    environment = run.to_json()["environment"]
    assert isinstance(environment["host_load_average"], float) and environment["host_cpus"] == os.cpu_count()


def test_a_run_stopped_early_still_records_the_load(tiny):
    settings = tiny_settings()
    events = race(settings, PROMPT, tiny.loader(settings), baseline=True)
    run = next(events)
    assert run.host_load is None                     # measured over the race: not yet
    events.close()                                   # what a Stop does to the race
    assert run.host_load is not None and not run.done


def test_a_recording_keeps_each_runs_load_and_old_files_still_load(tiny, tmp_path):
    settings = tiny_settings()
    run = execute(settings, PROMPT, tiny.loader(settings), baseline=True)
    path = rec.save(tmp_path / "run.json", [run])
    record = json.loads(path.read_text())
    assert isinstance(record["environment"]["host_load_average"], float)
    assert rec.load(path).runs[0].host_load == run.host_load
    # A file written before the load was recorded loads, with no load.
    for key in ("host_load_average", "host_cpus", "host_steal_share"):
        del record["runs"][0]["summary"][key]
        record["environment"].pop(key, None)
    old = rec.loads(json.dumps(record))
    assert old.runs[0].host_load is None and old.runs[0].stats == run.stats
    # A load no host reports is a damaged file, with the recording's one message.
    record["runs"][0]["summary"].update(host_cpus=2, host_load_average=-1.0)
    with pytest.raises(SpecvizError, match="run 1 is damaged"):
        rec.loads(json.dumps(record))


def busy_run(tiny, load: HostLoad, *, baseline: bool = True):
    settings = tiny_settings()
    run = execute(settings, PROMPT, tiny.loader(settings), baseline=baseline)
    run.host_load = load
    return run


def test_a_busy_host_gets_a_warning_in_the_summary_and_the_run_view(tiny):
    stolen = HostLoad(load_average=1.0, cpus=2,
                      steal_share=steal_share(parse_proc_stat(STAT_START), parse_proc_stat(STAT_END)))
    assert stolen.busy                               # 12% stolen, though the load average is low
    run = busy_run(tiny, stolen)
    warning = busy_host_text(run)
    assert warning == ("the host was busy (load 1.0 on 2 cores, 12% steal): absolute times and tokens/s are "
                       "inflated; the interleaved speedup stays fair (both methods paid alike)")
    assert f"warning: {warning}" in summary_lines(run)
    assert warning in RunRenderer().view(run, "Finished.", final=True).stats
    overloaded = HostLoad(load_average=3.1, cpus=2, steal_share=0.0)
    assert overloaded.busy
    assert busy_host_text(busy_run(tiny, overloaded, baseline=False)) == (
        "the host was busy (load 3.1 on 2 cores, 0% steal): absolute times and tokens/s are inflated")


def test_a_quiet_host_gets_no_warning(tiny):
    quiet = HostLoad(load_average=2.0, cpus=2, steal_share=0.01)   # the run's own threads fill the cores
    assert not quiet.busy
    run = busy_run(tiny, quiet)
    assert busy_host_text(run) is None
    assert not any("busy" in line for line in summary_lines(run))
    assert "busy" not in RunRenderer().view(run, "Finished.", final=True).stats
    unreported = HostLoad(load_average=None, cpus=2, steal_share=None)   # an OS without either
    assert not unreported.busy and busy_host_text(busy_run(tiny, unreported)) is None


# ----------------------------------------------------------------------------- package edges

def test_the_version_is_written_once():
    project = read_configuration(ROOT / "pyproject.toml")["project"]
    assert "version" in project["dynamic"]           # pyproject reads it from the package
    assert project["version"] == specviz.__version__ == host.environment("cpu")["specviz"]


def test_no_module_of_a_layer_imports_the_package_root():
    # The root re-exports the library's face (and so imports core); a layer importing it would
    # import everything the root does, and hide a layer violation behind the package name.
    graph = grimp.build_graph("specviz", include_external_packages=False)
    importers = graph.find_modules_that_directly_import("specviz")
    assert importers <= {"specviz.__main__"}, importers


def test_last_drains_and_keeps_the_final_item():
    finished = []

    def growing():
        yield 1
        yield 2
        finished.append(True)                       # reached only when drained to the end

    assert last(growing()) == 2 and finished == [True]
    assert last(iter([])) is None
    assert last(x for x in [math.pi]) == math.pi
