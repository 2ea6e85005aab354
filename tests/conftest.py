"""Shared fixtures: tiny causal LMs built in-process from a config. Nothing is downloaded."""

import contextlib
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from specviz.core.events import BONUS, RESAMPLED, Cycle

VOCAB = 97

# Tiny models are dominated by per-op overhead, where extra threads only add contention (and on a
# loaded 2-core machine, oversubscription). Real-model tests ask for their share of the cores with
# `all_threads`: all of them, or under pytest-xdist (pyproject's addopts) the cores over the workers.
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
ALL_THREADS = max(1, torch.get_num_threads() // WORKERS)
torch.set_num_threads(1)


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


@pytest.fixture
def all_threads():
    torch.set_num_threads(ALL_THREADS)
    yield ALL_THREADS
    torch.set_num_threads(1)


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


def reference(target, prompt, eos=None, n=40):
    """`target.generate`'s greedy continuation of `prompt`: what speculative decoding must equal."""
    out = target.generate(prompt, do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=0)
    return out[0, prompt.shape[1]:].tolist()


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


@pytest.fixture(scope="session")
def tiny():
    """The tiny model pair (tests/tiny_pair.py): stands in for `specviz.runs.load` as `tiny.loader`."""
    from tiny_pair import TinyModels

    torch.set_grad_enabled(False)
    return TinyModels()


# ----------------------------------------------------------------------------- browser tests

CHROMIUM = "/usr/bin/chromium"       # Debian's package (playwright cannot download its own browser here)


def wait_for_app(process, url: str, seconds: float) -> None:
    """Until the app started as `process` (stderr piped) answers at `url`; fails if it exits or times out."""
    import time
    import urllib.request

    deadline = time.monotonic() + seconds
    while True:
        if process.poll() is not None:
            pytest.fail(f"the server exited: {process.stderr.read().decode()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer within {seconds:.0f} s")
            time.sleep(0.5)


@contextlib.contextmanager
def running_app(**extra_env):
    """`python app.py` on a free port, not hosted, with `extra_env`; yields its URL, terminated on leaving."""
    import socket
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    env = dict(os.environ, HF_HUB_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False", GRADIO_SERVER_PORT=str(port),
               PYTHONPATH=str(root), **extra_env)
    env.pop("SPECVIZ_HOSTED", None)
    process = subprocess.Popen([sys.executable, str(root / "app.py")], env=env, cwd=root,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}/"
    try:
        wait_for_app(process, url, 180)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=60)


@pytest.fixture(scope="module")
def cores_alone():
    """Held for a module whose timing bounds cannot share the two cores with the llama.cpp Load tab's
    browser test (test_first_screen; test_load_llamacpp_browser): the two never overlap on the xdist
    workers; the one that comes second waits."""
    import fcntl
    import tempfile
    from pathlib import Path

    with open(Path(tempfile.gettempdir()) / "specviz-tests-cores-alone.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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
