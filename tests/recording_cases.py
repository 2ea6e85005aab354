"""Recordings at the load caps, built as JSON from a tiny model's real recording: its settings,
models and environment are kept, its cycles and steps replaced by as many as the caps allow, shaped
to cost the views the most (every draft rejected, so every drafted token is shown with its hover,
and long token texts). `PYTHONPATH=. python tests/recording_cases.py FILE` renders a recording (load,
summary, the Replay tab's view, charts, the report) and prints what it cost as JSON."""

from __future__ import annotations

import copy
import json

from specviz.runs import recording as rec
from specviz.runs import recording_checks as caps

TEXT = "x" * 14       # a token's text: long enough that the file's texts reach MAX_TEXT_CHARS


def chain_cycle(index: int, k: int, text: str = TEXT) -> dict:
    """A chain of k drafts, all rejected, then the target's correction."""
    drafted = [(index + j) % 90 + 3 for j in range(k)]
    return {"index": index, "k": k, "drafted": drafted, "num_accepted": 0, "emitted": [2], "correction": 2,
            "correction_kind": "resampled", "correction_prob": 0.5, "draft_probs": [1.0] * k,
            "target_probs": [0.25] * k, "uniforms": [], "residual_top": [], "greedy": True,
            "draft_seconds": 0.001, "verify_seconds": 0.01, "target_top": [], "drafted_text": [text] * k,
            "correction_text": text}


def cross_cycle(index: int, k: int, pieces: int, text: str = TEXT) -> dict:
    """A chain drafted across tokenizers: `pieces` draft model tokens, the last one's text cut."""
    return {**chain_cycle(index, k, text), "draft_pieces": [text] * pieces, "cut_text": text,
            "shared_mass": [0.5] * pieces}


def tree_cycle(index: int, nodes: int, depth: int, text: str = TEXT) -> dict:
    """A tree whose path goes `depth` deep and whose other nodes are all tried and rejected
    (children of the root and of the path's nodes, as verification tries them)."""
    parents = [j - 1 for j in range(depth)] + [(j % (depth + 1)) - 1 for j in range(depth, nodes)]
    drafted = [(index + j) % 90 + 3 for j in range(nodes)]
    return {"index": index, "k": depth, "drafted": drafted, "num_accepted": depth,
            "emitted": drafted[:depth] + [2], "correction": 2, "correction_kind": "resampled",
            "correction_prob": 0.5, "draft_probs": [1.0] * nodes, "target_probs": [0.25] * nodes,
            "uniforms": [], "residual_top": [], "greedy": True, "draft_seconds": 0.001, "verify_seconds": 0.01,
            "target_top": [], "parents": parents, "path": list(range(depth)),
            "node_verdicts": ["accepted"] * depth + ["rejected"] * (nodes - depth),
            "drafted_text": [text] * nodes, "correction_text": text}


def steps(count: int, text: str = TEXT) -> list[dict]:
    return [{"index": i, "token": 5, "prob": 0.5, "seconds": 0.01, "text": text} for i in range(count)]


def with_runs(template: dict, runs: list[tuple[dict, list[dict], list[dict]]]) -> dict:
    """`template` (a recording's JSON) holding one run per (settings changes, cycles, steps)."""
    record = copy.deepcopy(template)
    first = record["runs"][0]
    record["runs"] = []
    for number, (settings, cycles, plain) in enumerate(runs):
        run = copy.deepcopy({**first, "cycles": [], "steps": []})
        run["settings"].update(settings)
        run.update(cycles=cycles, steps=plain, baseline=bool(plain), label=f"run {number}")
        record["runs"].append(run)
    return record


CHAIN = dict(draft="ngram", k=rec.LOCAL.max_k, max_new_tokens=rec.LOCAL.max_new_tokens)
TREE = dict(draft="self:1", k=rec.LOCAL.max_k, branch=8, tree_budget=caps.MAX_NODES,
            max_new_tokens=rec.LOCAL.max_new_tokens)


def worst(kind: str, template: dict) -> dict:
    """The costliest recording of each kind the caps allow."""
    tokens = rec.LOCAL.max_new_tokens
    if kind == "chain":      # MAX_DRAFTED drafted tokens, all rejected; 4,096 cycles and steps; ~4 M characters
        k = rec.LOCAL.max_k
        return with_runs(template, [(CHAIN, [chain_cycle(i, k) for i in range(tokens)], steps(tokens))])
    if kind == "tree":       # MAX_DRAFTED nodes in trees of MAX_NODES, every unaccepted node rejected
        cycles = caps.MAX_DRAFTED // caps.MAX_NODES
        depth = tokens // cycles - 1
        return with_runs(template, [(TREE, [tree_cycle(i, caps.MAX_NODES, depth) for i in range(cycles)],
                                     steps(tokens))])
    if kind == "events":     # as many cycles and steps as fit in MAX_BYTES, in runs of 4,096 tokens
        runs, events = [], 0
        while events + 2 * tokens <= caps.MAX_EVENTS:
            runs.append((dict(CHAIN, k=1), [chain_cycle(i, 1, "") for i in range(tokens)], steps(tokens, "")))
            events += 2 * tokens
            if len(rec.dumps(with_runs(template, runs)).encode()) > rec.MAX_BYTES:
                runs.pop()
                break
        return with_runs(template, runs)
    if kind == "depths":     # runs of 4,096 cycles, one asking k = MAX_NODES: every chart by depth is 512 wide
        runs, events = [], 0
        while events + tokens <= caps.MAX_EVENTS:
            cycles = [chain_cycle(i, 0, "") for i in range(tokens)]
            cycles[0]["k"] = caps.MAX_NODES
            runs.append((dict(CHAIN, k=1), cycles, []))
            events += tokens
            if len(rec.dumps(with_runs(template, runs)).encode()) > rec.MAX_BYTES:
                runs.pop()
                break
        return with_runs(template, runs)
    raise ValueError(kind)


def render(path: str) -> dict:
    """Load, summarise, chart, view and report the recording at `path`: CPU seconds of each, the
    peak resident memory above what the process held before, and the sizes produced."""
    import time

    from specviz.views.report import DetailLimitedRenderer, report_html

    def resident(field: str) -> int:   # VmRSS: now; VmHWM: the peak (ru_maxrss would count the parent's)
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith(field + ":"))

    before = resident("VmRSS")
    seconds, start = {}, time.process_time()

    def lap(name: str) -> None:
        nonlocal start
        now = time.process_time()
        seconds[name] = now - start
        start = now

    loaded = rec.load(path)
    lap("load")
    summaries = [(run.stats, run.speed) for run in loaded.runs]
    lap("summarize")
    views = [DetailLimitedRenderer().view(run, "Replayed.", final=True) for run in loaded.runs]
    lap("view")
    charts = sum(len(figure.to_json()) for view in views for figure in view[2:6])
    lap("charts")
    page = report_html([loaded])
    lap("report")
    peak = resident("VmHWM") - before
    return {"seconds": seconds, "total_seconds": sum(seconds.values()), "peak_bytes": peak,
            "input_bytes": len(open(path, "rb").read()), "report_bytes": len(page.encode()),
            "token_view_bytes": max(len(view.tokens) for view in views), "chart_bytes": charts,
            "estimated_bytes": rec.footprint(loaded), "runs": len(summaries)}


if __name__ == "__main__":
    import sys

    print(json.dumps(render(sys.argv[1])))
