"""The whole page (`build_demo`), and what launching it needs: Gradio's options, torch's threads and
a warm start of the default models."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import sys
import threading
import time

import gradio as gr
import torch

from ..models.devices import use_threads
from ..runs import Loader
from ..runs.run import load
from ..runs.shared_race import SharedRaces
from ..settings import RunSettings
from .common import (QUEUE_MAX_SIZE, TEMP_FILE_SECONDS, TEMP_SWEEP_SECONDS, SessionMemories, is_hosted, limits_for,
                     session_loader, sweep_old_exports)
from .compare_tab import build_compare_tab
from .explain_tab import build_explain_tab
from .load_tab import build_load_tab
from .replay_tab import build_replay_tab
from .run_tab import build_run_tab
from .shared_run import race_slots
from .style import CSS, DARK_JS, HEAD, KEYS_NOTE, LARGE_TEXT_JS, PRESENTER_JS, theme
from .teach_tab import build_teach_tab
from .tools import build_tools, only_tools_public
from .train_tab import build_train_tab

log = logging.getLogger("specviz.ui")

MAX_UPLOAD = "16mb"                # uploads (recordings, prompt sets) beyond this are refused by Gradio
# Sessions whose page state Gradio keeps at once (its default: 10,000), the least recently used dropped
# first. A session holds the last value of every output an event updated (token views, figures) and its
# gr.State values, ~4 MB after two runs (measured, see README "Hosted mode"): 128 of them ~0.5 GB. A
# closed session's goes at once (`forget_session`); this bounds those whose close never arrives.
SESSION_CAPACITY = 128
# Gradio removes its temporary files (every upload, its copy of every download) older than
# TEMP_FILE_SECONDS, looking every TEMP_SWEEP_SECONDS.
TEMP_FILES = (TEMP_SWEEP_SECONDS, TEMP_FILE_SECONDS)


def build_demo(*, loader: Loader | None = None, hosted: bool | None = None, mcp: bool | None = None) -> gr.Blocks:
    """The whole app. `loader` replaces `runs.load` (tests pass tiny in-process models). With `mcp`
    (default: `mcp_wanted()`) only the tools (`ui.tools`) are public, the tabs' events undocumented."""
    limits = limits_for(is_hosted() if hosted is None else hosted)
    loader = session_loader(loader)
    memories = SessionMemories()
    races = SharedRaces(slots=race_slots())     # the Run tab's and the race tool's: one measurement each
    freed = MemoryRelease()                     # ended sessions collected once per burst
    sweep_old_exports()                # what an earlier server left behind
    with gr.Blocks(title="specviz: speculative decoding, live", delete_cache=TEMP_FILES) as demo:
        # One short band: the name, one sentence, and the display switches (stacked on a phone).
        with gr.Row(equal_height=False, elem_id="sv-header"):
            gr.Markdown("# specviz: speculative decoding, live\n"
                        "A fast drafter proposes *k* tokens, the target checks them all in one pass; plain "
                        "decoding of the same model races it, one pass per token.", scale=1, elem_id="sv-title")
            large = gr.Checkbox(False, label="Large text", container=False, scale=0, min_width=130,
                                elem_id="large-text")
            presenter = gr.Checkbox(False, label="Presenter", container=False, scale=0, min_width=130,
                                    elem_id="presenter")
            dark = gr.Button("Light / dark", size="sm", scale=0, min_width=110, elem_id="dark-toggle")
        large.change(None, large, large, js=LARGE_TEXT_JS, api_visibility="private")
        presenter.change(None, presenter, presenter, js=PRESENTER_JS, api_visibility="private")
        dark.click(None, None, None, js=DARK_JS, api_visibility="private")
        last_run = gr.State(None)  # the latest Compare or Teach run, for the Explain tab's numbers
        with gr.Tabs(elem_id="tabs") as tabs:
            with gr.Tab("Run", id="run-tab"):
                run_tab = build_run_tab(limits=limits, loader=loader, memories=memories, races=races)
            with gr.Tab("Compare", id="compare-tab"):
                build_compare_tab(limits=limits, loader=loader, last_run=last_run)
            with gr.Tab("Load", id="load-tab"):
                load_tab = build_load_tab(limits=limits, loader=loader)
            with gr.Tab("Teach", id="teach-tab"):
                build_teach_tab(limits=limits, loader=loader, last_run=last_run)
            with gr.Tab("Explain", id="explain-tab"):
                build_explain_tab(last_run=last_run)
            with gr.Tab("Replay", id="replay-tab"):
                build_replay_tab()
            if not limits.hosted:          # training writes files and runs for minutes: one's own machine only
                with gr.Tab("Train", id="train-tab"):
                    build_train_tab(loader=loader, run_tab=run_tab, tabs=tabs, load_tab=load_tab)
        gr.Markdown(KEYS_NOTE, elem_id="sv-keys")
        build_tools(limits=limits, loader=loader, races=races, memories=memories)
        # A session that ends (tab closed, API client gone) frees its suffix memory and its page state
        # at once. One handler: Gradio runs each unload handler as an event of that session, which
        # would give the session a fresh page state again after `forget_session` had dropped it.
        def end_session(request: gr.Request) -> None:
            memories.end(request)
            forget_session(demo, request.session_hash)
            freed.soon()
            log.info("a session ended: its memory and page state released (collected within %.0f s)",
                     freed.delay)

        demo.unload(end_session)
    demo.queue(max_size=QUEUE_MAX_SIZE)
    if mcp_wanted() if mcp is None else mcp:
        only_tools_public(demo)
    return demo


def mcp_wanted() -> bool:
    """`python app.py --mcp`, or Gradio's own GRADIO_MCP_SERVER=True."""
    return "--mcp" in sys.argv[1:] or os.environ.get("GRADIO_MCP_SERVER", "").strip().lower() in ("1", "true")


def forget_session(demo: gr.Blocks, session_hash: str | None) -> None:
    """Drop what Gradio keeps of a closed session: its gr.State values (their delete callbacks run)
    and its page state, the last value of every output an event updated. Gradio itself marks a closed
    session and deletes its gr.State values an hour later, and its page state never: only when
    `state_session_capacity` later sessions push it out (issue 25: ~4 MB per closed session). A page
    that reconnects after this starts from the page's defaults, as a reloaded page does."""
    holder = getattr(demo, "state_holder", None)        # set when the server starts
    if holder is None or session_hash is None:
        return
    holder.delete_state(session_hash)
    with holder.lock:
        holder.session_data.pop(session_hash, None)
        holder.time_last_used.pop(session_hash, None)


def _glibc():
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:                  # not glibc (macOS, musl): its allocator is left as it is
        return None


GLIBC = _glibc()
M_MMAP_THRESHOLD = -3                # mallopt's parameter number (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20


def configure_allocator() -> str:
    """Allocations of 1 MiB or more (a long prompt's activations and KV cache) get pages of their own
    from the OS, returned when freed. glibc's default moves this threshold up to 32 MiB after the first
    large free, after which such tensors come from per-thread heaps; each run's are freed on whichever
    worker thread ran it, and resident memory kept every heap's high-water mark. Returns a log line."""
    if GLIBC is None:
        return "allocator: not glibc, left as it is"
    GLIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    return f"allocator: allocations of {MMAP_THRESHOLD_BYTES >> 20} MiB or more are mapped apart"


def release_freed_memory() -> None:
    """Free what a closed session left unreachable (its page state holds reference cycles), then hand
    the allocator's free pages back to the OS (glibc's malloc_trim)."""
    gc.collect()
    if GLIBC is not None:
        GLIBC.malloc_trim(0)


RELEASE_DELAY_SECONDS = 1.0


class MemoryRelease:
    """`release_freed_memory` once for a burst of ended sessions: `soon()` runs it RELEASE_DELAY_SECONDS
    later unless a run of it is already due (a class leaving at once ended thirty sessions within a
    second, and each collected the server's whole heap: ~5% of the server's CPU in that class)."""

    def __init__(self, delay: float = RELEASE_DELAY_SECONDS, release=release_freed_memory):
        self.delay, self.release = delay, release
        self._due = False
        self._lock = threading.Lock()

    def soon(self) -> None:
        with self._lock:
            if self._due:
                return
            self._due = True
        timer = threading.Timer(self.delay, self._run)
        timer.daemon = True
        timer.start()

    def _run(self) -> None:
        with self._lock:
            self._due = False         # a session ending from here on is freed by the next run
        self.release()


def launch_options(hosted: bool | None = None) -> dict:
    """Keyword arguments for `demo.launch` (Gradio 6 takes the theme, CSS and head scripts there);
    hosted, at most SESSION_CAPACITY sessions' page state is kept at once. Also makes Gradio's
    can-I-reach-localhost check patient (see patient_localhost_check)."""
    patient_localhost_check()
    options = dict(theme=theme(), css=CSS, head=HEAD, max_file_size=MAX_UPLOAD)
    if mcp_wanted():
        options["mcp_server"] = True
    if is_hosted() if hosted is None else hosted:
        options["state_session_capacity"] = SESSION_CAPACITY
    return options


def patient_localhost_check(seconds: float = 60.0) -> None:
    """`launch` asks its own server for `/` once (a 3 s timeout) and, on a miss, stops with "When
    localhost is not accessible, a shareable link must be created". A host whose cores are busy
    (loading a model, a test suite, another server) misses that 3 s and the app never starts: ask
    again for up to `seconds` before giving the same answer."""
    from gradio import networking

    check = getattr(networking, "url_ok", None)
    if check is None or getattr(check, "specviz_patient", False):
        return

    def patient(url: str) -> bool:
        deadline = time.monotonic() + seconds
        while True:
            if check(url):
                return True
            if time.monotonic() > deadline:
                return False
            time.sleep(1.0)

    patient.specviz_patient = True
    networking.url_ok = patient


# How long a Python thread may hold the interpreter lock while another waits for it. A race runs
# thousands of short torch operations a second, and takes the lock back after each: at Python's
# default (5 ms), whenever the server's own threads (drawing, serialising, the event loop) run Python
# the race waits up to 5 ms per operation. Measured here (AMD EPYC, built-in model, fp32): a race
# beside one busy Python thread took 758 s of wall time at 5 ms and 72 s at 0.5 ms, against 7.5 s alone.
SWITCH_SECONDS = 0.0005


def configure_torch() -> str:
    """For the app on a CPU: one torch thread, so each decoding event runs on one thread and is timed
    by that thread's CPU time (the server and the browser share the cores and cannot inflate it).
    SPECVIZ_THREADS=N overrides. Also shortens the interpreter's switch interval (SWITCH_SECONDS), so
    that the server's own Python work does not stall a race between its torch operations. Returns a
    line for the log."""
    torch.set_grad_enabled(False)
    sys.setswitchinterval(SWITCH_SECONDS)
    threads = os.environ.get("SPECVIZ_THREADS", "").strip()
    return use_threads(int(threads) if threads.isdigit() and int(threads) > 0 else None) + \
        f"; interpreter switch interval {SWITCH_SECONDS * 1000:g} ms"


def warm_up(loader: Loader | None = None) -> threading.Thread:
    """Load the default pair in the background so that the first run starts at once (a run that
    comes sooner waits for the same load instead of starting another)."""
    def work():
        try:
            (loader or load)(RunSettings(), None)
            log.info("default models ready")
            # Gradio, plotly and the models live as long as the server: leave them out of every later
            # collection, which then walks only what requests create (a full walk of the ~560,000
            # start-up objects costs ~0.3 s; decoding is timed with collection paused, see core.timing).
            gc.collect()
            gc.freeze()
        except Exception:  # noqa: BLE001 - the first run will report it properly
            log.warning("warming up the default models failed", exc_info=True)

    thread = threading.Thread(target=work, name="specviz-warm-up", daemon=True)
    thread.start()
    return thread
