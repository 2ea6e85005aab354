"""A race in a process of its own: `forked_race` is `run.race` run in a child forked from this one,
its growing `Run` rebuilt here from what the child sends as it goes.

Why: a race runs thousands of short torch operations a second, and between them it needs Python's
interpreter lock. In a server (the app, a class pressing Run at once) the lock is also wanted by the
event loop, the queue and the drawing for every viewer, and a race beside them took 2-4 times its wall
time alone (docs/spaces.md). In a child of its own it has an interpreter of its own.

How: the child is forked after the models are loaded, so their weights are shared with this process
(copy-on-write: nothing writes to them), and it runs only the race. It sends the run once without
events, then each event as it comes (a cycle or a plain step with its text) and whichever of the run's
other fields changed, never the whole run again; at the end, the cost tables it measured (the policy's,
`cost_tables.costs_for`), which this process keeps as if it had measured them, so the next race skips the
calibration. A consumer that stops reading (a Stop, a viewer leaving) ends the child. An error in the
child is raised here; a child that dies (killed for memory) is a `SpecvizError` saying so.

What the child lets go of at once: the server's sockets it inherited (a copy held here kept every
connection the server closed open for the browser, which sent its next request, a Stop, into one and
waited on it for ever; and kept the server's port), and its life past this process's (it is killed
when the thread that forked it ends: a server stopped by a signal leaves no race decoding on).

Only on a CPU (a forked child cannot use a CUDA context made before the fork; a GPU runs one race at a
time anyway), on Linux (macOS forks, but not safely once its system frameworks have started), and not
inside a worker process already (ZeroGPU's);
`SPECVIZ_RACE_PROCESSES=0` keeps races in this process.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import dataclasses
import functools
import multiprocessing
import os
import pickle
import queue
import signal
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from ..errors import SpecvizError
from ..models import ModelPair
from ..settings import RunSettings, switched_on
from .result import Run
from .cost_tables import adopt_costs, costs_for
from .run import race

EVENT_FIELDS = ("cycles", "texts", "steps", "step_texts")
ENV = "SPECVIZ_RACE_PROCESSES"
# A race yields the processor to the server: a page answering at once matters more than a race
# finishing a moment sooner, and the race's figures are its own thread's CPU time, which the
# scheduler's order does not change.
RACE_NICENESS = 10
_PR_SET_PDEATHSIG = 1      # prctl's option (linux/prctl.h): a signal for this process when its parent thread ends


def can_fork(pair: ModelPair) -> bool:
    """Whether `forked_race` can race this pair: on a CPU, where processes fork, unless turned off or
    this is a worker process already (ZeroGPU's: the race is away from the server's interpreter there)."""
    return (getattr(pair.device, "type", str(pair.device)) == "cpu"
            and sys.platform.startswith("linux")        # macOS: forking after its frameworks start is unsafe
            and "fork" in multiprocessing.get_all_start_methods()
            and not multiprocessing.current_process().daemon
            and switched_on(ENV))


def forked_race(settings: RunSettings, prompt: str, pair: ModelPair, **options) -> Iterator[Run]:
    """`run.race(settings, prompt, pair, **options)` in a forked child: the same runs, yielded here as
    the child's run grows. Closing the generator ends the child."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_race_in_child, args=(send, settings, prompt, pair, options, os.getpid()),
                            name="specviz-race", daemon=True)
    child.start()
    send.close()
    run: Run | None = None
    try:
        while True:
            try:
                kind, payload = pickle.loads(receive.recv_bytes())
            except EOFError:
                child.join(5)
                raise SpecvizError(f"The race's worker process ended before the race did (exit code "
                                   f"{child.exitcode}; killed for memory?). Try fewer new tokens or a smaller "
                                   "model.") from None
            if kind == "run":
                run = payload
                run._decode = functools.partial(pair.tokenizer.decode, skip_special_tokens=True)
                yield run
            elif kind == "events":
                _grow(run, *payload)
                yield run
            elif kind == "costs":
                adopt_costs(pair, payload)
            elif kind == "error":
                raise payload
            else:       # "end"
                return
    finally:
        receive.close()
        if child.is_alive():
            child.kill()
        child.join()


def _grow(run: Run, events: dict, changed: dict) -> None:
    for name, new in events.items():
        getattr(run, name).extend(new)
    for name, value in changed.items():
        setattr(run, name, value)


def _fields(run: Run) -> dict:
    """The run's fields besides its events and caches."""
    return {f.name: getattr(run, f.name) for f in dataclasses.fields(run)
            if f.name not in EVENT_FIELDS and not f.name.startswith("_")}


def workers_of(pid: int) -> list[int]:
    """The live child processes of process `pid` (a server's race workers), from Linux's /proc; [] where
    there is none to read."""
    found = []
    for task in (Path(f"/proc/{pid}/task").iterdir() if Path(f"/proc/{pid}/task").is_dir() else []):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


def _race_in_child(send, settings: RunSettings, prompt: str, pair: ModelPair, options: dict, parent: int) -> None:
    """The child: race, sending what changed after each event. It writes nothing to the inherited
    standard streams (another thread of the parent may have held their locks at the fork)."""
    _die_with_the_forking_thread(parent)
    _let_go_of_sockets(keep={send.fileno()})
    sys.stdout = sys.stderr = open(os.devnull, "w")
    if RACE_NICENESS:
        os.nice(RACE_NICENESS)
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    # Each message pickled as it comes (nothing changes under it), then written by a thread of its own:
    # a server slow to read (its interpreter busy with thirty viewers) then delays what the viewers
    # see, never the race (writing to a full pipe would stall it).
    sender = threading.Thread(target=_send_all, args=(outbox, send), name="specviz-race-sender", daemon=True)
    sender.start()
    try:
        _race_into(outbox, settings, prompt, pair, options)
    finally:
        outbox.put(None)
        sender.join()
        send.close()


def _die_with_the_forking_thread(parent: int) -> None:
    """SIGKILL this process when the thread that forked it ends (Linux's PR_SET_PDEATHSIG), and end
    now if `parent` is gone already."""
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:          # it ended before prctl took hold
        os._exit(0)


def _let_go_of_sockets(keep: set[int]) -> None:
    """Every socket inherited at the fork but `keep`, replaced by /dev/null: the parent's connections
    close when the parent closes them. (Replaced, not closed: the parent's socket objects copied here
    still name those numbers, and a number closed and reused could be closed again under the race.)"""
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for name in os.listdir("/proc/self/fd"):
            fd = int(name)
            if fd in keep or fd == null:
                continue
            try:
                if stat.S_ISSOCK(os.fstat(fd).st_mode):
                    os.dup2(null, fd)
            except OSError:
                continue        # the listing's own descriptor, closed by now
    finally:
        os.close(null)


def _send_all(outbox: queue.SimpleQueue, send) -> None:
    while (message := outbox.get()) is not None:
        try:
            send.send_bytes(message)
        except (BrokenPipeError, OSError):
            return          # the parent stopped reading


def _race_into(outbox: queue.SimpleQueue, settings: RunSettings, prompt: str, pair: ModelPair, options: dict) -> None:
    sent = dict.fromkeys(EVENT_FIELDS, 0)       # events sent so far, by field
    fields: dict | None = None                  # the other fields as last sent
    try:
        for run in race(settings, prompt, pair, **options):
            now = _fields(run)
            if fields is None:
                template = dataclasses.replace(run, **{name: [] for name in EVENT_FIELDS}, _decode=None)
                outbox.put(pickle.dumps(("run", template)))
                fields = now
            events = {name: getattr(run, name)[sent[name]:] for name in EVENT_FIELDS
                      if len(getattr(run, name)) > sent[name]}
            sent = {name: len(getattr(run, name)) for name in EVENT_FIELDS}
            changed = {name: value for name, value in now.items() if fields[name] != value}
            fields = {name: copy.copy(value) for name, value in now.items()}
            if events or changed:
                outbox.put(pickle.dumps(("events", (events, changed))))
        outbox.put(pickle.dumps(("costs", costs_for(pair))))
        outbox.put(pickle.dumps(("end", None)))
    except BaseException as error:  # noqa: BLE001 - the parent raises it
        try:
            pickle.dumps(error)
        except Exception:  # noqa: BLE001 - an error that does not pickle goes as its text
            error = RuntimeError(f"{type(error).__name__}: {error}")
        outbox.put(pickle.dumps(("error", error)))
