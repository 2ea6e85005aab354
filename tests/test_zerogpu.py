"""The app's GPU work as ZeroGPU runs it, with the hardware faked and specviz's code as it is.

On a ZeroGPU Space, `spaces.GPU` (the `spaces` package, read at 0.51.3: `zero/decorator.py`,
`zero/wrappers.py`) runs a decorated generator function in a forked worker: the arguments are pickled
to the worker, every value the function yields is pickled back (a value that does not pickle ends the
stream), and an `async` function is refused (`NotImplementedError`). The worker is attached and its
tensors moved on the first call, so a race whose warm-up ran in one call and whose timing ran in
another would time that attach. `FakeZeroGPU` does what the package does to the values and the calls,
in this process, and notes which call each model forward ran in.
"""

import asyncio
import copy
import functools
import importlib
import inspect
import os
import pickle
import sys
import types

import gradio as gr
import pytest
from gradio.helpers import special_args

from specviz.ui import build_demo, common, spaces as specviz_spaces
from specviz.ui.common import StopSignal


class FakeZeroGPU:
    """`spaces.GPU` as ZeroGPU runs it. `decorated` holds every function it wrapped, `forwards` the call
    (1, 2, ...; None between two yields, when the worker is not running the function) of every model
    forward, `yielded` what crossed the process boundary."""

    def __init__(self):
        self.decorated: dict = {}
        self.calls = 0
        self.active = None
        self.forwards: list = []

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
            args, kwargs = pickle.loads(pickle.dumps((args, kwargs)))   # the arguments cross as well
            self.calls += 1
            call = self.calls
            steps = task(*args, **kwargs)
            try:
                self.active = call
                for value in steps:
                    self.active = None
                    crossed = pickle.loads(pickle.dumps(value))   # raises where the worker's queue would
                    yield crossed
                    self.active = call
            finally:
                self.active = None
                steps.close()

        self.decorated[in_worker] = task
        return in_worker

    def watch(self, model) -> None:
        model.register_forward_pre_hook(lambda module, args: self.forwards.append(self.active))


@pytest.fixture
def zerogpu(monkeypatch):
    """A fake `spaces` package installed, specviz's `ui.spaces` re-imported against it, and
    `ui.common.GPU` (imported from there) following; undone afterwards."""
    fake = FakeZeroGPU()
    module = types.ModuleType("spaces")
    module.GPU = fake.GPU
    monkeypatch.setitem(sys.modules, "spaces", module)
    importlib.reload(specviz_spaces)
    monkeypatch.setattr(common, "GPU", specviz_spaces.GPU)
    assert common.GPU == fake.GPU
    yield fake
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


def test_every_gpu_event_streams_picklable_views_and_runs_its_models_inside_one_call(tiny, zerogpu):
    for model in (tiny.target, tiny.short, tiny.small, tiny.random, tiny.other):
        zerogpu.watch(model)
    demo = build_demo(loader=tiny.loader, hosted=False)
    events = gpu_events(demo, zerogpu.decorated)
    assert set(events) == GPU_EVENTS
    # Each decorated work belongs to one event; Run's races and the race tool's have one each.
    assert len(zerogpu.decorated) == len(GPU_EVENTS) + 1

    for name, block_function in sorted(events.items()):
        zerogpu.forwards.clear()
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
