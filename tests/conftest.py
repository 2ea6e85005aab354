"""Shared fixtures: tiny causal LMs built in-process from a config. Nothing is downloaded."""

import contextlib
import os
import shutil
import time
import weakref
from pathlib import Path
from typing import NamedTuple

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from specviz.core.events import BONUS, RESAMPLED, Cycle
from specviz.engines.vllm_server import free_port
from specviz.models.devices import use_threads

VOCAB = 97

# Tiny models are dominated by per-op overhead, where extra threads only add contention (and on a
# loaded 2-core machine, oversubscription). Real-model tests ask for their share of the cores with
# `all_threads`: all of them, or under pytest-xdist (pyproject's addopts) the cores over the workers.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
ALL_THREADS = max(1, torch.get_num_threads() // WORKERS)
use_threads(1)      # chosen, as the command line's --threads chooses: a run keeps what a test sets


@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config):
    """pyproject's addopts run the whole suite on two xdist workers. A run of named files or tests,
    or one with -s or --pdb, stays in one process unless -n is given: starting a second worker costs
    more than it saves there, xdist's workers do not print to the terminal, and --pdb refuses them."""
    given = config.invocation_params.args
    if any(arg.startswith(("-n", "--numprocesses")) for arg in given):
        return
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or config.option.capture == "no" \
            or config.option.usepdb:
        config.option.numprocesses = 0


# The modules that start real engine servers (vLLM on a CPU takes about a minute of both cores to
# start, and its tests start about a dozen) run one after another on one worker, as one xdist scope:
# side by side on two workers, the vLLM engine tests and the vLLM Load tab's browser test each took
# half as long again and the browser test timed out (a CI run here). They come first, and then the
# longest of the other modules (seconds in a CI run here, two workers), so that xdist, handing each
# worker the next scope as it finishes one, does not leave one worker running a five-minute module
# at the end while the other has finished.
ENGINE_SERVERS = ["test_engine_vllm", "test_load_vllm_browser", "test_engine_llamacpp", "test_load_llamacpp_browser"]
LONGEST_FIRST = [*ENGINE_SERVERS, "test_e2e", "test_docs_run", "test_sampling", "test_policy_trees",
                 "test_offline_pair", "test_recording_bounds", "test_head", "test_soak", "test_load_browser",
                 "test_batched", "test_cross_tokenizer"]


# The tests marked `alone` (below) run as one more xdist scope, first, on one worker, holding the cores
# from the first to the last of them: one wait for the other worker's current test instead of one per
# test. Handed out one at a time between the other worker's tests, each waited for whatever long test
# ran there (a vLLM sweep, a browser test: 3-4 minutes) while its own worker idled (a profile here: 786
# worker-seconds idle in a 43-minute run). xdist's controller sees node ids, not marks, so the scope
# is named here, and collection fails when it and the marks disagree.
ALONE = ("tests/test_first_screen.py::",
         "tests/test_e2e.py::test_the_default_example_measures_the_same_speedup_in_every_fresh_app")


def in_alone_scope(nodeid: str) -> bool:
    return nodeid.startswith(ALONE)


def pytest_collection_modifyitems(config, items):
    disagree = [item.nodeid for item in items
                if in_alone_scope(item.nodeid) != (item.get_closest_marker("alone") is not None)]
    if disagree:
        raise pytest.UsageError(f"tests/conftest.py's ALONE and the `alone` marks disagree on: {disagree}")
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}

    def rank_of(item) -> int:
        return -1 if in_alone_scope(item.nodeid) else rank.get(item.module.__name__, len(rank))

    items.sort(key=rank_of)     # stable: files keep their order


def pytest_xdist_make_scheduler(config, log):
    """xdist's per-file scheduling (`--dist loadfile`), with the engine-server modules as one scope and the
    `alone` tests as another."""
    from xdist.scheduler import LoadFileScheduling

    class EnginesTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if in_alone_scope(nodeid):
                return "cores alone"
            file = nodeid.split("::", 1)[0]
            return "engine servers" if Path(file).stem in ENGINE_SERVERS else file

    return EnginesTogether(config, log)


@pytest.fixture
def all_threads():
    use_threads(ALL_THREADS)
    yield ALL_THREADS
    use_threads(1)


def make_llama(seed: int, layers: int = 4, vocab: int = VOCAB, hidden: int = 64, eos: int | None = None,
               context: int = 512):
    # A larger initializer_range than the default spreads the logits out, so that greedy argmax
    # is not decided by float round-off between one-token and multi-token forwards.
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=context, initializer_range=0.3,
                         bos_token_id=None, eos_token_id=eos, pad_token_id=None)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    return model


def make_gpt2(seed: int, layers: int = 3, vocab: int = VOCAB, hidden: int = 64, eos: int | None = None):
    torch.manual_seed(seed)
    config = GPT2Config(vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512,
                        initializer_range=0.3, bos_token_id=None, eos_token_id=eos, pad_token_id=None)
    model = GPT2LMHeadModel(config).eval()
    model.generation_config.eos_token_id = eos
    return model


def make_qwen2(seed: int, layers: int = 3, vocab: int = VOCAB, hidden: int = 64, eos: int | None = None):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.3, bos_token_id=None, eos_token_id=eos, pad_token_id=None,
                         use_sliding_window=False)
    model = Qwen2ForCausalLM(config).eval()
    model.generation_config.eos_token_id = eos
    return model


def truncated_copy(model, layers: int):
    """A smaller draft that shares the target's first layers' weights (copied), so it agrees with
    the target part of the time, like a real small draft model."""
    config = model.config.__class__(**model.config.to_dict())
    if hasattr(config, "n_layer"):
        config.n_layer = layers
    else:
        config.num_hidden_layers = layers
    small = model.__class__(config).eval()
    small.load_state_dict(model.state_dict(), strict=False)
    small.generation_config.eos_token_id = model.generation_config.eos_token_id
    return small


_references: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def reference(target, prompt, eos=None, n=40):
    """`target.generate`'s greedy continuation of `prompt`: what speculative decoding must equal.
    Computed once per model, prompt and arguments (parametrized tests over k or the drafter ask
    for the same one); the key holds the model's config and every parameter's storage and version,
    so a model changed in place is generated again."""
    state = (target.config.to_json_string(), target.generation_config.to_json_string(),
             tuple((p.data_ptr(), p._version) for p in target.parameters()))
    key = (state, tuple(prompt.shape), tuple(prompt.flatten().tolist()), eos, n)
    known = _references.setdefault(target, {})
    if key not in known:
        out = target.generate(prompt, do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0)
        known[key] = out[0, prompt.shape[1]:].tolist()
    return list(known[key])


def make_cycle(index=0, drafted=(1, 2, 3), num_accepted=1, correction=9, **fields) -> Cycle:
    """A hand-made chain cycle whose fields agree with each other (`emitted`, the correction's
    kind, one probability per drafted token), for tests of what reads cycles. Any field may be
    given; `k` defaults to the number drafted."""
    drafted = list(drafted)
    n = len(drafted)
    record = dict(index=index, k=max(n, 1), drafted=drafted, num_accepted=num_accepted,
                  emitted=drafted[:num_accepted] + ([] if correction is None else [correction]),
                  correction=correction,
                  correction_kind=None if correction is None else BONUS if num_accepted == n else RESAMPLED,
                  correction_prob=0.5, draft_probs=[0.9] * n, target_probs=[0.4] * n, uniforms=[],
                  residual_top=[], greedy=True, draft_seconds=0.01, verify_seconds=0.04)
    record.update(fields)
    return Cycle(**record)


@contextlib.contextmanager
def counting_forwards(model):
    """A list that grows by one at each forward of `model` while the block runs. The hook sits on the
    model's last decoder layer: an early-exit draft shares the first layers (and, being a shallow copy,
    the model's own hook dicts) but never runs the last, so only the target's passes are counted."""
    forwards: list[float] = []
    handle = model.model.layers[-1].register_forward_hook(lambda *_: forwards.append(time.monotonic()))
    try:
        yield forwards
    finally:
        handle.remove()


@pytest.fixture(scope="session")
def llama():
    return make_llama(0)


@pytest.fixture(scope="session")
def gpt2():
    return make_gpt2(0)


@pytest.fixture
def prompt():
    return torch.tensor([[5, 9, 13, 22, 5, 9, 13, 40, 41, 5, 9]])


@pytest.fixture(scope="module", autouse=True)
def measured_costs_of_this_module_only():
    """Each test module starts from a process that has measured no pass or drafting costs (the
    cost-aware policy's tables, `runs.cost_tables`), as an app or a command starts: the session's cached tiny
    models would otherwise carry one module's tables into the next, including those timed by a faked
    clock, and whether a test's run calibrates would depend on which modules ran before it."""
    from specviz.runs import cost_tables as run_module

    kept = run_module._PASS_COSTS, run_module._DRAFT_COSTS
    run_module._PASS_COSTS, run_module._DRAFT_COSTS = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()
    yield
    run_module._PASS_COSTS, run_module._DRAFT_COSTS = kept


@pytest.fixture(scope="session")
def tiny():
    """The tiny model pair (tests/tiny_pair.py): stands in for `specviz.runs.load` as `tiny.loader`."""
    from tiny_pair import TinyModels

    torch.set_grad_enabled(False)
    return TinyModels()


# ----------------------------------------------------------------------------- browser tests

CHROMIUM = "/usr/bin/chromium"       # Debian's package (playwright cannot download its own browser here)


class App(NamedTuple):
    url: str
    pid: int


@contextlib.contextmanager
def running_app(*args: str, tiny: bool = False, log: Path | None = None, seconds: float = 180, **extra_env):
    """An app server on a free port; yields App(url, pid) once it answers, terminated (killed after 20 s)
    on leaving. Default: `python app.py` as the README starts it, not hosted. tiny=True:
    `tests/serve_tiny.py ARGS` (the tiny in-process models in hosted mode; args `slow`, `long`). Its output
    goes to `log` (or a temporary file); a start that fails or times out shows the output's end."""
    import subprocess
    import sys
    import tempfile
    import time
    import urllib.request

    root = Path(__file__).resolve().parent.parent
    port = free_port()
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False",
               GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port), PYTHONPATH=str(root))
    if tiny:
        env["OMP_NUM_THREADS"] = "1"
    for hosted in ("SPECVIZ_HOSTED", "SPACE_ID"):
        env.pop(hosted, None)
    env.update(extra_env)
    script = root / "tests" / "serve_tiny.py" if tiny else root / "app.py"
    scratch = None      # a folder made here for the log: removed with the app (a given log is the caller's)
    if log is None:
        scratch = Path(tempfile.mkdtemp(prefix="specviz-app-"))
        log = scratch / "app.log"
    with open(log, "w") as output:
        process = subprocess.Popen([sys.executable, str(script), *args], env=env, cwd=root, stdout=output,
                                   stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + seconds
    try:
        while True:
            if process.poll() is not None:
                pytest.fail(f"{script.name} exited with {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url, timeout=5):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    pytest.fail(f"{script.name} did not answer within {seconds:.0f} s:\n{log.read_text()[-3000:]}")
                time.sleep(0.5)
        yield App(url, process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def default_sigint():
    """A child's preexec_fn: SIGINT back to its default before it starts. A shell that starts pytest with
    `&` and no job control sets SIGINT to ignored, an ignored signal stays ignored across exec, and Python
    then installs no KeyboardInterrupt handler: the command under test would never see the Ctrl-C a test
    sends (the vLLM and llama.cpp Ctrl-C tests failed so, in a full run here started with `&`)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_or_kill(process, seconds: float) -> int:
    """`process.wait(seconds)`, killing it if it is still running then (a test that fails here must not
    leave a sweep running beside the rest of the suite)."""
    import subprocess

    try:
        return process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(f"the command was still running {seconds:.0f} s after the signal (killed)")


# ----------------------------------------------------------------------------- tests that need the cores alone

# The suite runs on two xdist workers. A test marked `alone` (a bound on how soon the page shows
# something) runs while the other worker runs nothing: every test holds a shared lock for its whole
# protocol (setup with its module's fixtures, call, teardown), an `alone` one an exclusive lock, kept
# until the next test of its worker is not `alone` (they run together, as one scope, above). A turnstile
# keeps the exclusive request from waiting forever: while it waits, no new test starts.
ALONE_LOCKS = ("specviz-tests-turnstile.lock", "specviz-tests-cores.lock")
_held_alone = None          # the cores lock, held exclusively by this worker across its `alone` tests


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    global _held_alone
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl
    import tempfile

    alone = item.get_closest_marker("alone") is not None
    cores = _held_alone
    if cores is None:
        turnstile, cores = (open(Path(tempfile.gettempdir()) / name, "a") for name in ALONE_LOCKS)
        with turnstile:
            fcntl.flock(turnstile, fcntl.LOCK_EX)
            fcntl.flock(cores, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        _held_alone = cores if alone else None
    try:
        yield
    finally:
        if not (alone and nextitem is not None and nextitem.get_closest_marker("alone") is not None):
            cores.close()
            _held_alone = None


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium, one per test module, driven by playwright."""
    playwright = pytest.importorskip("playwright.sync_api")
    with playwright.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        yield browser
        browser.close()


def reordered_copy(model, target_tokenizer, draft_tokenizer):
    """The target's weights with its embedding and LM-head rows reordered into the draft
    tokenizer's ids (which may leave some of the target's tokens out): the same model reading
    another vocabulary, so it drafts what the target picks."""
    draft = make_llama(0, layers=model.config.num_hidden_layers, vocab=len(draft_tokenizer))
    rows = ("model.embed_tokens.weight", "lm_head.weight")     # copied below, in the draft's order
    draft.load_state_dict({k: v for k, v in model.state_dict().items() if k not in rows}, strict=False)
    target_vocab = target_tokenizer.get_vocab()
    order = [target_vocab[token] for token, _ in sorted(draft_tokenizer.get_vocab().items(), key=lambda kv: kv[1])]
    with torch.no_grad():
        draft.model.embed_tokens.weight.copy_(model.model.embed_tokens.weight[order])
        draft.lm_head.weight.copy_(model.lm_head.weight[order])
    draft.generation_config.eos_token_id = draft_tokenizer.eos_token_id   # the config's default id is another word
    return draft
