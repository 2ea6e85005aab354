"""What a closed session leaves in the hosted app's memory: start `python app.py` in hosted mode
(SPECVIZ_HOSTED=1, the built-in model) on a loopback port, warm it up, then open one session after
another (gradio_client: connect, two suffix-decoding runs on ~3,400-character prompts, close) and read
the server's resident memory (/proc/PID/status VmRSS) after each has closed. Prints the series and
its drift; the target is flat within 20 MB over 30 sessions.

    python scripts/session_soak.py                 # 5 warm-up sessions, then 30
    python scripts/session_soak.py --sessions 12 --max-new-tokens 16

Each session takes ~10-20 s on a 2-core CPU (the prompts' prefill dominates)."""

from __future__ import annotations

import argparse
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SUFFIX = "Suffix decoding (tree from the longest earlier match)"
RAW = "Raw completion"
PROMPT_CHARS = 3400
WORDS = ("the a river city morning light old new quiet market road bridge garden window story letter friend "
         "teacher village winter summer rain wind stone house door table book song child mother father "
         "walked found opened carried remembered wrote waited listened laughed slowly again before after "
         "under over near far because while although and but then so").split()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def prompt(rng: random.Random) -> str:
    """~3,400 characters of sentences, different every time (suffix decoding remembers each)."""
    sentences = []
    while sum(map(len, sentences)) < PROMPT_CHARS:
        words = [rng.choice(WORDS) for _ in range(rng.randint(6, 14))]
        sentences.append(" ".join(words).capitalize() + ". ")
    return "".join(sentences)[:PROMPT_CHARS].rsplit(" ", 1)[0]


def run_inputs(text: str, max_new_tokens: int) -> list:
    # The /run endpoint's inputs: prompt, target (blank: built-in), drafter, draft model, exit layer, k,
    # dynamic k, temperature, top-p, top-k, max new tokens, seed, prompt format, branch.
    return [text, "", SUFFIX, "", 1, 8, False, 0.0, 1.0, 0, max_new_tokens, 0, RAW, 1]


def start_app(log, **settings: str | None) -> tuple[subprocess.Popen, str]:
    """`python app.py` on a free loopback port, offline, its environment changed by `settings` (None:
    removed); returns the process and its URL once it answers."""
    port = free_port()
    env = dict(os.environ, GRADIO_SERVER_PORT=str(port), GRADIO_SERVER_NAME="127.0.0.1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1", GRADIO_ANALYTICS_ENABLED="False")
    for name, value in settings.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    process = subprocess.Popen([sys.executable, "app.py"], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the app exited (code {process.returncode}); see {log.name}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return process, url
        except OSError:
            time.sleep(1)
    process.kill()
    raise SystemExit("the app did not start in 300 s")


def session(url: str, rng: random.Random, max_new_tokens: int) -> None:
    from gradio_client import Client

    client = Client(url, verbose=False)
    try:
        for _ in range(2):
            stats = client.predict(*run_inputs(prompt(rng), max_new_tokens), api_name="/run")[6]
            if "Finished" not in stats:
                raise SystemExit(f"a run did not finish: {stats[:500]}")
    finally:
        client.close()              # the heartbeat ends: Gradio's unload event, the session is closed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=30, help="sessions measured after the warm-up")
    parser.add_argument("--warm-up", type=int, default=5, help="sessions before the first measurement")
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--heartbeat", type=float, default=2.0,
                        help="Gradio's heartbeat interval for the app, seconds (its default: 15)")
    parser.add_argument("--settle", type=float, default=5.0,
                        help="seconds after a close before reading RSS (more than --heartbeat)")
    parser.add_argument("--later", type=float, default=60.0, help="seconds to wait for the last reading")
    args = parser.parse_args()
    rng = random.Random(0)
    with tempfile.NamedTemporaryFile("w", prefix="session-soak-", suffix=".log", delete=False) as log:
        # A closed client's heartbeat thread ends only at the server's next heartbeat (15 s by default):
        # the server notices the close, and runs the page's unload, up to that late.
        process, url = start_app(log, SPECVIZ_HOSTED="1", SPACE_ID=None, GRADIO_HEARTBEAT_INTERVAL=str(args.heartbeat))
        try:
            for _ in range(args.warm_up):
                session(url, rng, args.max_new_tokens)
            time.sleep(args.settle)
            series = [rss_mb(process.pid)]
            print(f"after {args.warm_up} warm-up sessions: {series[0]:.0f} MB", flush=True)
            for n in range(1, args.sessions + 1):
                started = time.monotonic()
                session(url, rng, args.max_new_tokens)
                time.sleep(args.settle)
                series.append(rss_mb(process.pid))
                print(f"session {n}: {series[-1]:.0f} MB ({time.monotonic() - started:.0f} s)", flush=True)
            time.sleep(args.later)
            later = rss_mb(process.pid)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print("RSS after each closed session (MB): " + ", ".join(f"{mb:.0f}" for mb in series))
    print(f"{args.later:.0f} s later: {later:.0f} MB")
    print(f"drift over {args.sessions} sessions: {series[-1] - series[0]:+.0f} MB (range {min(series):.0f}-"
          f"{max(series):.0f} MB, {(series[-1] - series[0]) / args.sessions:+.2f} MB per session)")


if __name__ == "__main__":
    main()
