"""The app's GPU work as ZeroGPU runs it, with the hardware faked and specviz's code as it is.

On a ZeroGPU Space, `spaces.GPU` (the `spaces` package, read at 0.51.3: `zero/decorator.py`,
`zero/wrappers.py`) runs a decorated generator function in a worker process forked from the app's
(multiprocessing's 'fork' start method): the arguments are pickled to the worker through a queue,
every value the function yields is pickled back (a value that does not pickle ends the stream with
an error), an exception in the worker reaches the app as "ZeroGPU worker error", and an `async`
function is refused (`NotImplementedError`). Each decorated function keeps its worker for its next
call only while the scheduler says that call's GPU is the same and idle; otherwise the call forks a
fresh worker from the app, which has none of what earlier workers did. The worker is attached and
its tensors moved on the first call, so a race whose warm-up ran in one call and whose timing ran in
another would time that attach. `FakeZeroGPU` does the same with a real fork (`reuse` says whether a
decorated function's worker serves its next call), and notes which call each model forward ran in.
"""

import asyncio
import copy
import functools
import importlib
import inspect
import multiprocessing
import os
import pickle
import sys
import types
import weakref

import gradio as gr
import pytest
import torch
from gradio.helpers import special_args

from specviz.ui import build_demo, common, spaces as specviz_spaces
from specviz.ui.common import StopSignal

WORKER_SECONDS = 120            # a call's worker is killed, and the test fails, past this


class FakeZeroGPU:
    """`spaces.GPU` as ZeroGPU runs it, in forked workers. `decorated` holds every function it wrapped,
    `notes` what happened where: (what, the call (1, 2, ...) it happened in, None in this process,
    where ZeroGPU has no GPU), from `note`, in either process; `workers` the process that served each call."""

    def __init__(self, reuse: bool = False):
        self.reuse = reuse
        self.decorated: dict = {}
        self.calls = 0
        self.notes: list[tuple] = []
        self.workers: list[int] = []
        self.active = None              # in a worker: the call it is serving
        self._idle: dict = {}           # decorated task -> its worker (process, connection), between calls

    def GPU(self, task=None, *, duration=None, size=None, **options):
        if task is None or not callable(task):
            return lambda function: self.GPU(function, duration=duration, size=size)
        # spaces: coroutine functions raise; an async generator function would be run as a regular one
        # and its generator object would not pickle: refused here as well.
        if inspect.iscoroutinefunction(task) or inspect.isasyncgenfunction(task):
            raise NotImplementedError(f"{task.__name__}: ZeroGPU runs no async functions")
        if not inspect.isgeneratorfunction(task):
            raise AssertionError(f"{task.__name__}: the app's GPU work streams (a generator function)")

        @functools.wraps(task)
        def in_worker(*args, **kwargs):
            if self.active is not None:         # already in a worker (spaces: `forked`): run it here
                yield from task(*args, **kwargs)
                return
            self.calls += 1
            call = self.calls
            process, connection = self._idle.pop(task, None) or self._fork(task)
            connection.send_bytes(pickle.dumps((call, args, kwargs)))   # the arguments cross as well
            finished = False
            try:
                while True:
                    if not connection.poll(WORKER_SECONDS):
                        raise AssertionError(f"{task.__name__}: the worker gave nothing for {WORKER_SECONDS} s")
                    kind, value, notes = pickle.loads(connection.recv_bytes())
                    self.notes += notes
                    if kind == "end":
                        self.workers.append(value)
                        finished = True
                        return
                    if kind == "error":             # spaces raises this in the app; the worker's traceback is printed
                        finished = True
                        raise gr.Error(f"ZeroGPU worker error: {value}")
                    yield pickle.loads(value)
            finally:
                if finished and self.reuse and process.is_alive():
                    self._idle[task] = process, connection
                else:                               # a fresh worker next time (spaces: not idle, or stopped)
                    connection.close()
                    process.kill()
                    process.join()

        self.decorated[in_worker] = task
        return in_worker

    def _fork(self, task):
        ours, theirs = multiprocessing.Pipe()
        process = multiprocessing.get_context("fork").Process(target=self._serve, args=(task, theirs), daemon=True)
        process.start()
        theirs.close()
        return process, ours

    def _serve(self, task, connection) -> None:
        """The worker: each call's arguments in, each yielded value out (pickled), then "end"."""
        self.notes = []
        while True:
            try:
                call, args, kwargs = pickle.loads(connection.recv_bytes())
            except EOFError:
                return
            self.active = call
            try:
                for value in task(*args, **kwargs):
                    try:
                        data = pickle.dumps(value)
                    except (pickle.PicklingError, TypeError, AttributeError) as error:   # spaces: ends the stream
                        connection.send_bytes(pickle.dumps(("error", f"{type(error).__name__}: {error}",
                                                            self._notes())))
                        break
                    connection.send_bytes(pickle.dumps(("yield", data, self._notes())))
                else:
                    connection.send_bytes(pickle.dumps(("end", os.getpid(), self._notes())))
            except Exception as error:  # noqa: BLE001 (spaces sends any exception back as the call's result)
                connection.send_bytes(pickle.dumps(("error", f"{type(error).__name__}: {error}", self._notes())))
            self.active = None

    def _notes(self) -> list:
        seen, self.notes = self.notes, []
        return seen

    def note(self, what: str) -> None:
        self.notes.append((what, self.active))

    def watch(self, model) -> None:
        model.register_forward_pre_hook(lambda module, args: self.note("forward"))

    @property
    def forwards(self) -> list:
        """The call of every model forward (None: in this process)."""
        return [call for what, call in self.notes if what == "forward"]


@pytest.fixture
def zerogpu(request, monkeypatch):
    """A fake `spaces` package installed, specviz's `ui.spaces` re-imported against it, and
    `ui.common.GPU` (imported from there) following; undone afterwards. One torch thread: a process
    forked while torch's thread pool is busy can deadlock (spaces forks before the pool starts).
    Parametrized indirectly with `reuse` (default False: every call gets a fresh worker)."""
    fake = FakeZeroGPU(reuse=getattr(request, "param", False))
    module = types.ModuleType("spaces")
    module.GPU = fake.GPU
    monkeypatch.setitem(sys.modules, "spaces", module)
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    importlib.reload(specviz_spaces)
    monkeypatch.setattr(common, "GPU", specviz_spaces.GPU)
    assert common.GPU == fake.GPU
    yield fake
    for process, connection in fake._idle.values():
        connection.close()
        process.kill()
        process.join()
    torch.set_num_threads(threads)
    monkeypatch.delitem(sys.modules, "spaces")
    importlib.reload(specviz_spaces)


def decorated_work(fn, decorated):
    """The GPU-decorated function an event's handler runs, if any (through `functools.wraps`)."""
    while fn is not None:
        if fn in decorated:
            return fn
        fn = getattr(fn, "__wrapped__", None)
    return None


async def drain(handler, *args) -> list:
    return [item async for item in handler(*args)]


def initial_inputs(block_function, **by_elem_id) -> list:
    """The page's values of an event's inputs before anyone edits them (but `by_elem_id`), as its
    handler receives them: Gradio adds the request where a parameter asks for it by its annotation."""
    values = [copy.deepcopy(by_elem_id.get(block.elem_id, block.value)) for block in block_function.inputs]
    return special_args(block_function.fn, values, gr.Request(session_hash="zerogpu"))[0]


def errors(page) -> list[str]:
    return [value for item in page for value in item if isinstance(value, str) and "sv-error" in value]


# The events whose work borrows the GPU, by api name. A new one must be added here, with inputs
# that run it to the end on the tiny models.
GPU_EVENTS = {"run", "compare", "sweep", "load", "teach"}


# What the page's first values need changed for the tiny models: the target, and a layer they have.
TINY = {"target": "tiny", "teach-exit-layer": 2}


def gpu_events(demo, decorated) -> dict:
    """The events whose handler runs GPU work, and Run, whose GPU work is its race's
    (`ui.shared_run.race_stream`, run on the race's own thread for all its viewers)."""
    return {block_function.api_name: block_function for block_function in demo.fns.values()
            if decorated_work(block_function.fn, decorated) is not None or block_function.api_name == "run"}


# Slow: every event runs in a worker forked afresh, which times its passes again as on ZeroGPU (run in
# this process it took 18 s, forked 87 s, on a busy 2-core host).
@pytest.mark.slow
def test_every_gpu_event_streams_picklable_views_and_runs_its_models_inside_one_call(tiny, zerogpu):
    for model in (tiny.target, tiny.short, tiny.small, tiny.random, tiny.other):
        zerogpu.watch(model)
    demo = build_demo(loader=tiny.loader, hosted=False)
    events = gpu_events(demo, zerogpu.decorated)
    assert set(events) == GPU_EVENTS
    # Each decorated work belongs to one event; Run's races and the race tool's have one each.
    assert len(zerogpu.decorated) == len(GPU_EVENTS) + 1

    for name, block_function in sorted(events.items()):
        zerogpu.notes.clear()
        calls = zerogpu.calls
        page = asyncio.run(drain(block_function.fn, *initial_inputs(block_function, **TINY)))
        assert zerogpu.calls == calls + 1, name
        # Every item reached the page as the event's outputs: a TICK that lost its identity on the
        # way back from the worker would reach Gradio as a value of its own.
        assert page and all(isinstance(item, (list, tuple)) and len(item) == len(block_function.outputs)
                            for item in page), name
        assert not errors(page), name
        # The models ran (warm-up, calibration, both methods) in this event's one call, never between.
        assert zerogpu.forwards, name
        assert set(zerogpu.forwards) == {zerogpu.calls}, name


def test_stop_reaches_the_work_in_the_worker_which_holds_a_copy_of_its_signal(tiny, zerogpu):
    demo = build_demo(loader=tiny.loader, hosted=False)
    run = gpu_events(demo, zerogpu.decorated)["run"]
    signal = StopSignal.for_click(None)           # as the Run click picks it
    args = initial_inputs(run, **TINY, **{"max-new-tokens": 256})
    assert isinstance(args[-1], StopSignal)
    args[-1] = signal

    async def until_stopped() -> list:
        page = []
        async for item in run.fn(*args):
            page.append(item)
            if not signal.requested:
                signal.request()                   # as the Stop button does (in the main process), mid-load
        return page

    page = asyncio.run(until_stopped())
    summary = page[-1][[block.elem_id for block in run.outputs].index("stats")]
    assert "Stopped." in summary and "256 tokens" not in summary
    assert not signal.live and not os.path.exists(signal.flag)     # the click's end removed the flag


@pytest.mark.parametrize("changes", [
    {"drafter": common.SUFFIX},
    {"drafter": common.DRAFT_MODEL, "draft-model": "small", "branch": 2},          # a token tree
    {"drafter": common.DRAFT_MODEL, "draft-model": "other-tokenizer"},             # across tokenizers
    {"drafter": common.EARLY_EXIT, "exit-layer": 2, "max-new-tokens": 24},
    {"target": "no-such-model"},                                                   # a failure's page
])
def test_the_run_events_other_drafters_and_failures_cross_too(tiny, zerogpu, changes):
    demo = build_demo(loader=tiny.loader, hosted=False)
    run = gpu_events(demo, zerogpu.decorated)["run"]
    page = asyncio.run(drain(run.fn, *initial_inputs(run, **dict(TINY, **changes))))
    assert page and all(isinstance(item, (list, tuple)) and len(item) == len(run.outputs) for item in page)
    assert bool(errors(page)) == (changes.get("target") == "no-such-model")


# What a worker keeps: ZeroGPU forks each call's worker from the app unless the decorated function's
# last worker is still there for it (same GPU, idle). What a run learns in the worker (the target's
# timed pass costs, which the cost-aware policy plans with; a session's suffix-decoding memory; a pair
# loaded in the call) lives in that worker only: kept for the next call where the worker is reused,
# gone where the call gets a fresh one, which times the passes again (docs/spaces.md says so).
@pytest.mark.parametrize("zerogpu", [False, True], indirect=True, ids=["fresh worker", "reused worker"])
def test_what_a_run_learns_is_kept_for_the_next_call_only_where_the_worker_is_reused(tiny, zerogpu, monkeypatch):
    from specviz.core.lookup_trees import SuffixDrafter
    from specviz.runs import cost_tables

    calibrate, begin = cost_tables.calibrate, SuffixDrafter.begin

    def calibrating(*args, **kwargs):
        zerogpu.note("calibrated")
        return calibrate(*args, **kwargs)

    def beginning(drafter, prompt_ids):
        begin(drafter, prompt_ids)
        zerogpu.note(f"remembers {drafter.requests} requests")

    monkeypatch.setattr(cost_tables, "calibrate", calibrating)
    monkeypatch.setattr(SuffixDrafter, "begin", beginning)
    # The app's process has measured nothing yet (earlier tests in this process may have, on the same
    # cached tiny target: a forked worker would inherit their tables).
    monkeypatch.setattr(cost_tables, "_PASS_COSTS", weakref.WeakKeyDictionary())
    monkeypatch.setattr(cost_tables, "_DRAFT_COSTS", weakref.WeakKeyDictionary())
    demo = build_demo(loader=tiny.loader, hosted=False)
    run = gpu_events(demo, zerogpu.decorated)["run"]
    for _ in range(2):                              # the same click twice, in one session
        page = asyncio.run(drain(run.fn, *initial_inputs(run, **dict(TINY, drafter=common.SUFFIX))))
        assert page and not errors(page)
    notes = {call: [what for what, at in zerogpu.notes if at == call] for call in (1, 2)}
    # (The warm-up drafts with a suffix drafter of its own, which remembers nothing.)
    assert "calibrated" in notes[1] and "remembers 1 requests" not in notes[1]
    assert (zerogpu.workers[0] == zerogpu.workers[1]) == zerogpu.reuse
    if zerogpu.reuse:       # the pass costs are known, and the session's first run is remembered
        assert "calibrated" not in notes[2] and "remembers 1 requests" in notes[2], notes
    else:                   # the second call starts from the app's state: it times the passes again and
        assert notes[2] == notes[1], notes      # its suffix drafter remembers nothing of the first run
