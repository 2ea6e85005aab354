"""What every tab shares: the one queue, hosted-mode limits, the drafter controls, and `streaming`,
which turns a tab's work into a Gradio handler that a Stop or a closed browser really stops.

A tab's work is a plain generator that yields a view (a tuple of outputs) when the page should
change and `TICK` after every other decoding event. `streaming` runs it one step at a time in a
worker thread and forwards only the views. A cancel (Stop, or the client going away) lands between
two steps: the step in flight (at most one decoding cycle) finishes, the generator is closed, and
only then does the queue slot free up, so nobody can stack decoding threads by cancelling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import inspect
import logging
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

import gradio as gr

from ..catalog import list_presets
from ..errors import SpecvizError, expected, user_message
from ..files import write_atomic
from ..runs import Loader, recording
from ..runs.run import load
from ..settings import INVARIANT, LOCAL, SAMPLING_RULES, Limits, hosted, whole_number
from ..views import render
from .spaces import GPU

log = logging.getLogger("specviz.ui")

CONCURRENCY_ID = "gpu"            # every event that runs a model (or writes exports) joins this one queue
QUEUE_MAX_SIZE = 128              # requests waiting beyond this are turned away (a class is ~30-64; each waiting
                                  # request holds only its inputs: a prompt of at most 4,000 characters hosted)
MAX_NEW_TOKENS = 1024             # the sliders' range on one's own machine
GPU_SECONDS = 120                 # ZeroGPU time asked for per run (both methods, one call)
UPDATE_SECONDS = 0.25             # during a run the token views are redrawn at most this often,
CHART_SECONDS = 1.0               # and the charts (heavier for the browser) this often

PROMPT_LOOKUP, DRAFT_MODEL, EARLY_EXIT = "Prompt lookup (n-gram)", "Draft model", "Early exit (target's first layers)"
PROMPT_LOOKUP_TREE = "Prompt lookup tree (every earlier match, one pass)"
SUFFIX = "Suffix decoding (tree from the longest earlier match)"
AUTO = "Auto (each cycle the best of prompt lookup, suffix and the target's head)"
DRAFTERS = [PROMPT_LOOKUP, PROMPT_LOOKUP_TREE, SUFFIX, AUTO, DRAFT_MODEL, EARLY_EXIT]
CHAT, RAW = "Chat template", "Raw completion"
CUSTOM = "Custom"
MEMORY_SESSIONS = 64              # sessions whose suffix-decoding memory is kept at once (see SessionMemories)
# Temporary files (uploads, Gradio's copies of downloads, the export folders below) are removed once
# older than TEMP_FILE_SECONDS, looked for every TEMP_SWEEP_SECONDS: a file lives at most ~11 minutes.
# A download link or an uploaded recording older than that must be exported or uploaded again.
TEMP_FILE_SECONDS = 600
TEMP_SWEEP_SECONDS = 60
EXPORT_PREFIX = "specviz-export-"  # exports and recordings for download: one fresh temporary folder each.
# Gradio copies a returned file into its own cache at once, so a folder is only needed for that copy;
# it goes at the next export, or the next session's end, once older than TEMP_FILE_SECONDS.


class _Tick:
    """The type of TICK. On ZeroGPU a tab's work runs in a forked worker and every value it yields is
    pickled back: pickled by name, TICK is TICK again on this side (`streaming` tests identity)."""

    def __reduce__(self):
        return "TICK"

    def __repr__(self):
        return "TICK"


TICK = _Tick()                    # yielded by a tab's work after an event that changes nothing on the page


def sweep_old_exports(root: Path | None = None, max_age: float = TEMP_FILE_SECONDS) -> None:
    root = Path(root or tempfile.gettempdir())
    cutoff = time.time() - max_age
    for folder in root.glob(EXPORT_PREFIX + "*"):
        try:
            if folder.is_dir() and folder.stat().st_mtime < cutoff:
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:
            continue


def export_folder() -> Path:
    """A fresh folder for files to download; folders older than TEMP_FILE_SECONDS go first."""
    sweep_old_exports()
    return Path(tempfile.mkdtemp(prefix=EXPORT_PREFIX))


def recording_button(run, label: str = "run") -> object:
    """The download button offering `run` as a recording file."""
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"specviz-{label}-{run.target_name}-{run.draft_name}")[:80]
    path = recording.save(export_folder() / f"{name}.json", [run])
    return gr.update(value=str(path), visible=True, interactive=True)


ANIMATION_SIZE = (1280, 720)       # a projector; about 10 s of one core for a 128-token race


def animation_buttons(prefix: str = "") -> tuple[gr.Button, gr.DownloadButton]:
    """Make animation, then Download animation (offered once made): the race as a GIF, for a slide.
    Element ids `prefix` + make-animation, animation."""
    with gr.Row(elem_classes=["sv-animation-row"]):
        make = gr.Button("Make animation (GIF)", size="sm", scale=0, min_width=200, elem_id=prefix + "make-animation")
        download = gr.DownloadButton("Download animation", value=None, interactive=False, size="sm", scale=0,
                                     min_width=200, elem_id=prefix + "animation")
    return make, download


def animation_file(make_run: Callable[[], object], speed: float = 1.0, label: str = "run") -> object:
    """The Download animation button offering the race of `make_run()` as a GIF (`views.animation`,
    as `replay FILE --animation OUT.gif` writes it), at `speed`; a failure is a toast."""
    from ..views.animation import gif_bytes

    try:
        run = make_run()
        data, _, _ = gif_bytes(run, speed=speed, size=ANIMATION_SIZE)
    except Exception as exc:  # noqa: BLE001 - a failure becomes a message in the page
        gr.Warning(failure(exc, "animation"))
        return gr.update(value=None, interactive=False)
    name = re.sub(r"[^A-Za-z0-9._-]+", "-", f"specviz-{label}-{run.target_name}-{run.draft_name}")[:80]
    path = write_atomic(export_folder() / f"{name}.gif", data)
    return gr.update(value=str(path), interactive=True)


def session_loader(loader: Loader | None = None) -> Loader:
    """The app's loader. Loaded pairs are cached and shared by every visitor, so a drafter that
    remembers earlier requests (suffix) is replaced by a fresh one on each load: nobody's drafts
    (rejected ones are shown) come from another visitor's outputs. The Run tab then gives each
    session its own memory (`SessionMemories`)."""
    def load_private(settings, progress=None):
        pair = (loader or load)(settings, progress)
        fresh = pair.draft.without_memory()
        return pair if fresh is pair.draft else dataclasses.replace(pair, draft=fresh)
    return load_private


class SessionMemories:
    """The remembering drafters (suffix decoding) of each session, by Gradio's session hash, so that a
    session drafts from its own earlier runs and from nobody else's. Held here rather than in a
    `gr.State`, which Gradio keeps for an hour after its session closes (and, when only read and
    never an event's output, until 10,000 later sessions push it out): a session's memory is freed
    when the session ends (`end`, the page's unload event: a browser tab or an API client that
    disconnects), and at most `max_sessions` are kept, the least recently used dropped first. Each
    drafter bounds its own memory in tokens (`SuffixDrafter.max_tokens`, 65,536 int32 tokens =
    256 KiB), so all of it stays under `max_sessions` x that (16 MiB by default)."""

    def __init__(self, max_sessions: int = MEMORY_SESSIONS):
        self.max_sessions = max_sessions
        self._sessions: OrderedDict[str, dict] = OrderedDict()   # least recently used first
        self._lock = threading.Lock()

    def pair_for(self, pair, session: str | None):
        """`pair` with the session's own remembering drafter; other drafters as they are. Without a
        session (a call from outside Gradio) the drafter remembers nothing from before."""
        fresh = pair.draft.without_memory()
        if fresh is pair.draft:
            return pair
        if session is None:
            return dataclasses.replace(pair, draft=fresh)
        with self._lock:
            memory = self._sessions.pop(session, {})
            self._sessions[session] = memory
            while len(self._sessions) > self.max_sessions:
                self._sessions.popitem(last=False)
            drafter = memory.setdefault(pair.draft_name, fresh)
        return dataclasses.replace(pair, draft=drafter)

    def end(self, request: gr.Request) -> None:
        """The session is over (Gradio's unload): its memory goes."""
        with self._lock:
            self._sessions.pop(getattr(request, "session_hash", None), None)
        sweep_old_exports()

    def __len__(self) -> int:
        return len(self._sessions)


def is_hosted() -> bool:
    """Hosted mode (a public demo): presets only, capped output, no local paths. On with
    SPECVIZ_HOSTED=1, and on Hugging Face Spaces (SPACE_ID set) unless SPECVIZ_HOSTED=0."""
    flag = os.environ.get("SPECVIZ_HOSTED", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    return bool(os.environ.get("SPACE_ID"))


def presets() -> list[dict]:
    """The presets from assets/presets.json, or none if unavailable (typed ids still work locally)."""
    try:
        return list(list_presets())
    except SpecvizError:
        log.warning("could not read the presets", exc_info=True)
        return []


def limits_for(hosted_mode: bool) -> Limits:
    return hosted(presets()) if hosted_mode else LOCAL


def slider_max_new_tokens(limits: Limits) -> int:
    return min(limits.max_new_tokens, MAX_NEW_TOKENS)


def draft_spec(drafter: str, draft_model: str | None, exit_layer) -> str:
    """The drafter controls (radio, model box, layer slider) as a draft spec."""
    if drafter == PROMPT_LOOKUP:
        return "ngram"
    if drafter == PROMPT_LOOKUP_TREE:
        return "ngram-tree"
    if drafter == SUFFIX:
        return "suffix"
    if drafter == AUTO:
        return "auto"
    if drafter == EARLY_EXIT:
        return f"self:{whole_number('early-exit layer', exit_layer, 1, 1000)}"
    if drafter == DRAFT_MODEL:
        if not isinstance(draft_model, str) or not draft_model.strip():
            raise SpecvizError("Type a draft model id (or pick a preset), or choose prompt lookup or early exit.")
        return draft_model.strip()
    raise SpecvizError(f"Unknown drafter {drafter!r}: choose one of {', '.join(DRAFTERS)}.")


def gpu_task(fn: Callable | None = None, *, duration: int = GPU_SECONDS):
    """Run `fn` inside one ZeroGPU allocation on Spaces; a no-op elsewhere."""
    if fn is None:
        return lambda function: GPU(function, duration=duration)
    return GPU(fn, duration=duration)


# ----------------------------------------------------------------------------- handlers that stop

_DONE = object()
# The threads that run the works' steps: a waiting or watching visitor's step mostly sleeps, so a class
# of them must not queue behind asyncio's default pool (its size: cores + 4).
STEP_THREADS = 192
_steps = concurrent.futures.ThreadPoolExecutor(max_workers=STEP_THREADS, thread_name_prefix="specviz-step")


class StopSignal:
    """One run's Stop button as its work sees it. Stop sets it; the work checks it between two steps
    and ends with its own "Stopped" view. A Gradio cancel cannot do that: the page applies the Stop
    handler's output and the run's messages still in flight in either order, so a stopped run could
    go on showing "Running".

    A Run click puts its signal in the session's `gr.State` (one per button) before its work is
    queued (`click_with_stop`), and the work holds that one, so a Stop pressed while the run waits in
    the queue stops it as soon as it starts. The click takes a fresh signal unless the state's signal
    is `live` (its work is queued or running) and not yet stopped: Gradio does not start a button's
    work again while it is pending (trigger mode "once"), so a second Run pressed meanwhile must
    leave the running work's signal in place for Stop to reach it. A Run pressed right after a Stop
    gets its own signal and cannot revive the run that Stop was meant for.

    On ZeroGPU the work runs in a forked worker that gets a pickled copy of the signal, which Stop
    cannot reach. So a click's signal also names a file (`flag`): Stop creates it, every copy sees it,
    and the click's end removes it. The name is given by `for_click`, never copied from the state's
    first value (Gradio deep-copies that into every session)."""

    def __init__(self):
        self.stopped = False
        self.live = False
        self.flag: str | None = None

    @property
    def requested(self) -> bool:
        return self.stopped or (self.flag is not None and os.path.exists(self.flag))

    def request(self) -> None:
        self.stopped = True
        if self.flag is not None and self.live:
            Path(self.flag).touch()

    def ended(self) -> None:
        """The click's work ended, however it ended."""
        self.live = False
        if self.flag is not None:
            Path(self.flag).unlink(missing_ok=True)

    @staticmethod
    def for_click(current: StopSignal | None) -> StopSignal:
        """The signal a Run click's work gets, given the state's `current` one."""
        signal = current if current is not None and current.live and not current.requested else StopSignal()
        signal.live = True
        if signal.flag is None:
            signal.flag = os.path.join(tempfile.gettempdir(), f"specviz-stop-{uuid.uuid4().hex}")
        return signal


def click_with_stop(button, stop_button, handler: Callable, inputs: list, outputs: list, **queue):
    """`button` runs `handler` (an async generator function, see `streaming`) with a `StopSignal` as
    its last input, and `stop_button` sets that signal at once (no queue slot). The signal lives in a
    `gr.State` of this button alone; each click puts the one `StopSignal.for_click` picks there
    before the work is queued. Returns the handler's event."""
    signal = gr.State(StopSignal())
    stop_button.click(StopSignal.request, signal, None, queue=False, api_visibility="private")
    return button.click(StopSignal.for_click, signal, signal, queue=False, api_visibility="private").then(
        holding_its_signal(handler), [*inputs, signal], outputs, **queue)


def holding_its_signal(handler: Callable) -> Callable:
    """`handler`, whose signal (its last argument) stops being live when it ends, however it ends."""
    if not inspect.isasyncgenfunction(handler):
        raise TypeError("click_with_stop needs an async generator handler (see `streaming`)")

    @functools.wraps(handler)
    async def run(*args):
        try:
            async for item in handler(*args):
                yield item
        finally:
            args[-1].ended()

    return run


def streaming(work: Callable[..., Iterator]) -> Callable:
    """`work` (a generator function yielding views and TICKs) as an async-generator Gradio handler
    that stops within one step of a cancel and frees the queue slot only after that step."""

    @functools.wraps(work)
    async def handler(*args):
        loop = asyncio.get_running_loop()
        steps = work(*args)
        try:
            while True:
                step = loop.run_in_executor(_steps, next, steps, _DONE)
                try:
                    item = await asyncio.shield(step)
                except asyncio.CancelledError:
                    await asyncio.wait([step])   # the step in flight ends first; then the slot frees
                    raise
                if item is _DONE:
                    return
                if item is not TICK:
                    yield item
        finally:
            steps.close()

    return handler


class Throttle:
    """When a streaming view is due: at most every UPDATE_SECONDS, charts every CHART_SECONDS."""

    def __init__(self):
        self.last_view = self.last_charts = 0.0

    def due(self) -> tuple[bool, bool]:
        now = time.monotonic()
        if now - self.last_view < UPDATE_SECONDS:
            return False, False
        charts = now - self.last_charts >= CHART_SECONDS
        self.last_view, self.last_charts = now, now if charts else self.last_charts
        return True, charts


def failure(exc: BaseException, what: str = "run") -> str:
    """The message for the page; the traceback goes to the log when the error was not expected."""
    if not expected(exc):
        log.exception("%s failed", what)
    return user_message(exc)


def error_html(message: str, **wording) -> str:
    """A failure in the page (and a toast); `wording`: `render.error_html`'s heading and advice."""
    gr.Warning(message)
    return render.error_html(message, **wording)


def sampling_choice() -> gr.Radio:
    """The sampling algorithm of a sampled run (the Run and Compare tabs; temperature 0 ignores it)."""
    return gr.Radio(list(SAMPLING_RULES), value=INVARIANT, label="Sampling (temperature > 0)", elem_id="sampling",
                    info="invariant: the text is plain sampling's with this seed, whatever the drafter, k or policy; "
                         "classic: rejection sampling, accepts more of a draft model's tokens")
