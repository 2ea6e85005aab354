"""A class pressing Run at once: start `python app.py` as a Space would (SPACE_ID set: hosted mode, the
built-in model), make one warm-up run, then CLIENTS gradio_client sessions submit /run within a second,
most on the page's default example and some with a short prompt of their own, and read what each saw:
whether it was refused, its time to a first view and to a verdict (the last view, with the summary),
whether its race was shared, replayed or its own, and the server's peak resident memory.

    python scripts/class_at_once.py                      # 30 clients: 24 on the default example, 6 own
    python scripts/class_at_once.py --clients 8 --own 2

Targets (issue 52, on a 2-core CPU): none refused, p95 time to a verdict <= 30 s, worst <= 45 s, p95
time to a first view <= 3 s, RSS peak <= 1.5 GB. Times are wall clock: a busy host stretches them."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from session_soak import rss_mb, start_app  # noqa: E402

from specviz.runs.race_worker import workers_of  # noqa: E402

OWN_PROMPTS = ["Write a haiku about the sea.", "What is the capital of France?", "Name three prime numbers.",
               "Say hello in Spanish.", "Give me a synonym for happy.", "What colour is the sky?",
               "Count from one to five.", "Name a planet."]
FIRST_VIEW_POLL = 0.05        # seconds between a client's looks at what has come back
MEMORY_POLL = 1.0             # seconds between looks at the server's memory (PSS is costly to read)


class Student(threading.Thread):
    """One client: connects, waits for the bell, submits /run and times what comes back."""

    def __init__(self, url: str, prompt: str | None, bell: threading.Barrier, iterate: bool = False):
        super().__init__(daemon=True)
        self.url, self.prompt, self.bell, self.iterate = url, prompt, bell, iterate
        self.first = self.verdict = None
        self.refused = self.error = None
        self.measurement: dict | None = None
        self.figure: tuple | None = None        # the race's speedup, its interval and clock, as /run returned them

    @property
    def race(self) -> str:
        """Which race it saw: when it was measured, and for which prompt."""
        return self.measurement["measured_at"] + str(self.prompt)

    def run(self) -> None:
        from gradio_client import Client

        client = Client(self.url, verbose=False)
        try:
            self.bell.wait()
            start = time.monotonic()
            job = client.submit(**({"prompt": self.prompt} if self.prompt else {}), api_name="/run")
            # Not `for _ in job`: gradio_client's iterator polls every millisecond, and thirty of them
            # took a core from the server they measure (a class's browsers run on their own machines).
            for _ in job if self.iterate else ():          # --iterate: as the class's check did before
                if self.first is None:
                    self.first = time.monotonic() - start
            while not job.done():
                if self.first is None and job.outputs():
                    self.first = time.monotonic() - start
                time.sleep(FIRST_VIEW_POLL)
            if self.first is None and job.outputs():
                self.first = time.monotonic() - start
            outputs = job.outputs()
            last = outputs[-1] if outputs else None
            self.verdict = time.monotonic() - start
            summary = last[-1] if last else None
            if isinstance(summary, dict) and "measurement" in summary:
                self.measurement = summary["measurement"]
                figures = summary.get("summary") or {}
                self.figure = (figures.get("speedup"), figures.get("speedup_low"), figures.get("speedup_high"),
                               figures.get("clock"))
            else:
                self.error = str(last[-3] if last else "no output")[:200]
        except Exception as exc:  # noqa: BLE001 - a refusal or a failure, counted
            text = str(exc)
            if "Queue is full" in text:
                self.refused = text
            else:
                self.error = text[:200]
        finally:
            client.close()


def cpu_seconds(pid: int) -> tuple[float, float]:
    """The server's own CPU seconds, and its races' worker processes' that ended (reaped children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return tuple(sum(int(fields[i]) for i in pair) / os.sysconf("SC_CLK_TCK") for pair in ((11, 12), (13, 14)))


def tree_memory(pid: int) -> tuple[float, float]:
    """MB held by the server and its live race workers: the sum of their RSS (pages shared between
    them, the models' weights, counted once per process) and of their PSS (each shared page split
    between its sharers: what they hold together)."""
    rss = pss = 0.0
    for each in [pid] + workers_of(pid):
        try:
            rss += rss_mb(each)
            for line in Path(f"/proc/{each}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    pss += int(line.split()[1]) / 1024
        except (OSError, RuntimeError):
            pass
    return rss, pss


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered) + 0.5) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=30)
    parser.add_argument("--own", type=int, default=6, help="clients with a short prompt of their own")
    parser.add_argument("--iterate", action="store_true",
                        help="clients iterate the job (gradio_client polls every millisecond: a client that "
                             "costs the server's cores)")
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile("w", prefix="class-at-once-", suffix=".log", delete=False) as log:
        process, url = start_app(log, SPACE_ID="specviz/class-at-once", SPECVIZ_HOSTED=None)   # as a Space
        peak, sampling = [0.0, 0.0, 0.0, 0], threading.Event()     # server RSS, tree RSS, tree PSS, workers

        def sample():
            while not sampling.wait(MEMORY_POLL) and process.poll() is None:
                try:
                    rss, pss = tree_memory(process.pid)
                    peak[:] = [max(peak[0], rss_mb(process.pid)), max(peak[1], rss), max(peak[2], pss),
                               max(peak[3], len(workers_of(process.pid)))]
                except (OSError, RuntimeError):      # the server is stopping
                    return

        try:
            from gradio_client import Client

            warm = Client(url, verbose=False)
            warm.predict(prompt=OWN_PROMPTS[-1], api_name="/run")        # loads the models, as a first visitor
            warm.close()
            print(f"warmed up; RSS {rss_mb(process.pid):.0f} MB", flush=True)
            threading.Thread(target=sample, daemon=True).start()
            server_cpu, own_cpu, began = cpu_seconds(process.pid), time.process_time(), time.monotonic()
            bell = threading.Barrier(args.clients)
            prompts = [OWN_PROMPTS[i % len(OWN_PROMPTS)] if i < args.own else None for i in range(args.clients)]
            students = [Student(url, prompt, bell, args.iterate) for prompt in prompts]
            for student in students:
                student.start()
            for student in students:
                student.join(600)
            sampling.set()
            cpu = ([now - then for now, then in zip(cpu_seconds(process.pid), server_cpu)],
                   time.process_time() - own_cpu, time.monotonic() - began)
        finally:
            process.terminate()
            process.wait(timeout=30)
    served = [s for s in students if s.verdict is not None and s.measurement]
    verdicts, firsts = [s.verdict for s in served], [s.first for s in served if s.first is not None]
    refused = sum(s.refused is not None for s in students)
    failed = [s.error for s in students if s.error]
    print(f"{len(served)} of {len(students)} got a verdict, {refused} refused, {len(failed)} failed")
    for error in failed[:5]:
        print("  failed:", error)
    if verdicts:
        print(f"time to a verdict: median {statistics.median(verdicts):.1f} s, p95 {percentile(verdicts, 0.95):.1f} s, "
              f"worst {max(verdicts):.1f} s")
    if firsts:
        print(f"time to a first view: median {statistics.median(firsts):.2f} s, p95 {percentile(firsts, 0.95):.2f} s, "
              f"worst {max(firsts):.2f} s")
    races = {}
    for student in served:
        races.setdefault(student.race, []).append(student.measurement)
    shared = max((m[-1]["shown_to"] for m in races.values()), default=0)
    replays = sum(m["replay"] for s in served for m in [s.measurement])
    print(f"{len(races)} races measured for {len(served)} clients; the most shared shown to {shared}; "
          f"{replays} replays; labels e.g.: {served[-1].measurement['label'] if served else '-'}")
    figures = {}
    for student in served:
        figures.setdefault(student.race, (student.prompt, student.figure))
    for key, (prompt, figure) in figures.items():
        if figure and figure[0] is not None:
            low, high = (f"{figure[1]:.2f}", f"{figure[2]:.2f}") if figure[1] is not None else ("?", "?")
            ended = [s.verdict for s in served if s.race == key]
            print(f"  {prompt or 'the default example'}: {figure[0]:.2f}x ({low}-{high}, {figure[3]}); "
                  f"{len(ended)} got it after {min(ended):.1f}-{max(ended):.1f} s")
    print(f"memory peak: the server's RSS {peak[0]:.0f} MB; with its race workers (up to {peak[3]} at once) "
          f"RSS summed {peak[1]:.0f} MB, PSS summed {peak[2]:.0f} MB (log: {log.name})")
    print(f"CPU over the class's {cpu[2]:.0f} s: the server {cpu[0][0]:.0f} s, its race workers {cpu[0][1]:.0f} s, "
          f"these clients {cpu[1]:.0f} s (on the same cores); load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
