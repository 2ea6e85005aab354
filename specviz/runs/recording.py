"""Recordings: finished runs as one JSON file that replays anywhere, with no model and no tokenizer.

A recording holds one run (the Run tab, `run`) or several (`compare`), each with its settings,
models, prompt, every speculative cycle and every plain step (with each method's own timings and
each token's text as the tokenizer decoded it), the summary computed when it was recorded, and the
environment. `load` turns a file back into `Run`s, so a replay goes through the same views as a
live run; `replay` plays a run's events back in the order the race showed them.

Reading never executes anything from the file (plain JSON, checked field by field) and refuses,
with one message, a file that is too large, not JSON, not a recording, from a newer specviz,
inconsistent, holding text that is not Unicode, or costing more to show than any real run does.

What a recording may cost is bounded at load, before any view is built, by caps that no run within
the settings' own limits (`settings.LOCAL`: 4,096 new tokens, k up to 64, trees of up to 512 nodes)
reaches: see `MAX_BYTES` and the caps after it. A replay's wall time is bounded too:
`playback_scale` compresses a long recording's pacing to at most `MAX_PLAYBACK_SECONDS`.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing_extensions import TypedDict   # pydantic needs this one on Python < 3.12

import pydantic

from ..core.events import Cycle, Followed, Step, interleave
from ..errors import SpecvizError
from ..files import read_limited, write_atomic
from ..models.host import HostLoad, environment
from ..settings import LOCAL, RunSettings, validate
from .recording_checks import MAX_NOTE_CHARS, check_cost, check_cycle, check_text, check_time
from .result import CycleText, Run

FORMAT = "specviz-recording"
VERSION = 1
MAX_BYTES = 16 * 1024 * 1024       # a few thousand cycles take well under 1 MB

# A replay's pacing: at any speed, it plays in at most this long (a longer one is compressed).
MAX_PLAYBACK_SECONDS = 120.0

_CYCLES = pydantic.TypeAdapter(list[Cycle])
_STEPS = pydantic.TypeAdapter(list[Step])
_FOLLOWED = pydantic.TypeAdapter(Followed | None)
_SETTINGS = pydantic.TypeAdapter(RunSettings)
_STRINGS = pydantic.TypeAdapter(list[str])
_TEXT = pydantic.TypeAdapter(str | None)


# ----------------------------------------------------------------------------- writing

def run_record(run: Run, label: str | None = None) -> dict:
    """One run as the recording's JSON object."""
    return {
        "label": label or f"{run.target_name} + {run.draft_name}",
        "settings": run.settings.to_dict(),
        "prompt": run.prompt,
        "target": {"name": run.target_name, "parameters": run.target_parameters},
        "draft": {"name": run.draft_name, "parameters": run.draft_parameters},
        # What loading the pair said (`Run.note`, such as drafting across tokenizers).
        "note": run.note,
        "dtype": run.dtype, "device": run.device, "clock": run.clock,
        "prompt_tokens": run.prompt_tokens, "eos_token_ids": list(run.eos_token_ids),
        "baseline": run.baseline, "spec_done": run.spec_done, "plain_done": run.plain_done,
        "cycles": run.cycle_records(),
        "steps": [{**dataclasses.asdict(s), "text": text} for s, text in zip(run.steps, run.step_texts)],
        # Greedy outputs that parted: plain decoding's steps along the speculative text (`Run.followed`).
        "followed": dataclasses.asdict(run.followed) if run.followed is not None else None,
        "text": run.text,
        "summary": run.summary(),
    }


def recording(runs: Sequence[Run], labels: Sequence[str | None] = (), *, kind: str = "run") -> dict:
    """Runs (one, or a comparison's) as a recording: the whole file's JSON object."""
    labels = list(labels) + [None] * (len(runs) - len(labels))
    device = runs[0].device if runs else "cpu"
    return {"format": FORMAT, "version": VERSION, "kind": kind,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "environment": environment(device),
            "runs": [run_record(run, label) for run, label in zip(runs, labels)]}


def dumps(record: dict) -> str:
    return json.dumps(record, ensure_ascii=False, separators=(",", ":"))


def save(path: Path | str, runs: Sequence[Run], labels: Sequence[str | None] = (), *, kind: str = "run") -> Path:
    return write_atomic(path, dumps(recording(runs, labels, kind=kind)))


# ----------------------------------------------------------------------------- reading

@dataclasses.dataclass
class Recording:
    """A recording read back: its runs (finished `Run`s without models) and what else it says."""
    runs: list[Run]
    labels: list[str]
    kind: str
    created: str
    environment: dict
    name: str = ""                  # the file's name, for titles


def loads(data: bytes | str, name: str = "the recording") -> Recording:
    """A recording from a file's contents; SpecvizError, naming `name`, for anything else."""
    if isinstance(data, str):
        data = data.encode("utf-8", errors="replace")
    if len(data) > MAX_BYTES:
        raise SpecvizError(f"{name} is {len(data) / 2**20:.1f} MB; recordings are read up to "
                           f"{MAX_BYTES // 2**20} MB.")
    try:
        record = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:
        detail = "nested too deeply" if isinstance(error, RecursionError) else str(error)
        raise SpecvizError(f"{name} is not a specviz recording: it is not valid JSON ({detail}).") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise SpecvizError(f"{name} is not a specviz recording (it has no \"format\": \"{FORMAT}\").")
    version = record.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise SpecvizError(f"{name} has no valid format version.")
    if version > VERSION:
        raise SpecvizError(f"{name} was written by a newer specviz (recording format {version}; this one "
                           f"reads up to {VERSION}). Upgrade specviz to replay it.")
    runs = record.get("runs")
    if not isinstance(runs, list) or not runs:
        raise SpecvizError(f"{name} holds no runs.")
    check_cost(runs, name)
    check_text(record, name)
    loaded: list[Run] = []
    labels: list[str] = []
    for number, run_record_ in enumerate(runs, 1):
        try:
            run, label = _run_from(run_record_)
        except (pydantic.ValidationError, TypeError, KeyError, ValueError, OverflowError, SpecvizError) as error:
            detail = str(error).splitlines()
            detail = detail[1:3] if isinstance(error, pydantic.ValidationError) else detail[:1]
            raise SpecvizError(f"{name}: run {number} is damaged or incomplete ({'; '.join(detail)}).") from None
        loaded.append(run)
        labels.append(label if label not in labels else f"{label} ({number})")   # each one reachable by name
    environment_ = record.get("environment") if isinstance(record.get("environment"), dict) else {}
    return Recording(runs=loaded, labels=labels, kind=str(record.get("kind", "run")),
                     created=str(record.get("created", "")), environment=environment_, name=name)


def footprint(opened: Recording) -> int:
    """About how many bytes a loaded recording holds in memory, for caches bounded in bytes. Measured
    with tracemalloc on files at the caps (tests/test_recording_bounds.py): about 1.2 kB per cycle,
    0.4 kB per plain step, 100 bytes per drafted token and one per character of text; a draft model's
    own token (drafted across tokenizers), with its shared-vocabulary share, about 60 bytes and its text."""
    runs = opened.runs
    pieces = [cycle.draft_pieces for run in runs for cycle in run.cycles if cycle.draft_pieces]
    return (1200 * sum(len(run.cycles) for run in runs) + 400 * sum(len(run.steps) for run in runs)
            + 100 * sum(len(cycle.drafted) for run in runs for cycle in run.cycles)
            + sum(60 * len(own) + sum(map(len, own)) for own in pieces)
            + sum(len(run.prompt) + sum(map(len, run.step_texts))
                  + sum(len(t) for text in run.texts for t in text.drafted) for run in runs))


def load(path: Path | str) -> Recording:
    path = Path(path)
    return loads(read_limited(path, MAX_BYTES, "a recording"), path.name)


def recorded_seconds(summary, name: str, what: str) -> float | None:
    """A recorded race's wall-clock seconds `name` from its summary (`elapsed_wall_seconds`,
    `calibration_seconds`, `first_token_wall_seconds`); None in files from before it was recorded.
    ValueError ("its `what` is not a time") for a value no clock reads."""
    seconds = summary.get(name) if isinstance(summary, dict) else None
    if seconds is None:
        return None
    if type(seconds) not in (int, float) or not 0 <= seconds < float("inf"):
        raise ValueError(f"its {what} is not a time")
    return float(seconds)


def _strict(adapter: pydantic.TypeAdapter, value):
    """`value` (parsed JSON) validated as JSON in strict mode: no bool for an int, no "3" for 3."""
    return adapter.validate_json(json.dumps(value), strict=True)


def _run_from(record) -> tuple[Run, str]:
    if not isinstance(record, dict):
        raise TypeError("a run is not an object")
    fields_ = _strict(_RUN_FIELDS, {key: record[key] for key in _RUN_FIELDS_NAMES if key in record})
    missing = [key for key in ("cycles", "steps", "settings", "prompt", "dtype", "device", "clock", "prompt_tokens")
               if key not in record]
    if missing:
        raise KeyError(", ".join(missing))
    # Recordings made before the cost-aware policy drafted k every cycle: they say fixed_k by its absence;
    # those made before drafter-invariant sampling sampled the classic way: they say so by its absence.
    recorded = record["settings"]
    settings = validate(_strict(_SETTINGS, {"fixed_k": True, "sampling": "classic", **recorded}
                                if isinstance(recorded, dict) else recorded), LOCAL)
    if len(fields_["prompt"]) > LOCAL.max_prompt_chars:
        raise ValueError(f"its prompt is longer than {LOCAL.max_prompt_chars:,} characters")
    if len(fields_.get("note", "")) > MAX_NOTE_CHARS:
        raise ValueError(f"its note is longer than {MAX_NOTE_CHARS:,} characters")
    cycles = _strict(_CYCLES, record["cycles"])
    steps = _strict(_STEPS, record["steps"])
    texts = [CycleText(_strict(_STRINGS, c.get("drafted_text")), _strict(_TEXT, c.get("correction_text")))
             for c in record["cycles"]]
    step_texts = _strict(_STRINGS, [s.get("text") for s in record["steps"]])
    for number, (cycle, text) in enumerate(zip(cycles, texts)):
        check_cycle(cycle, text, number)
    for number, step in enumerate(steps):
        if step.index != number:
            raise ValueError(f"plain step {number} has another step's index")
        check_time(step.seconds, f"plain step {number}")
    followed = _strict(_FOLLOWED, record.get("followed"))
    if followed is not None:
        for number, step in enumerate(followed.steps, start=followed.start):
            if step.index != number:
                raise ValueError(f"plain step {number} along the speculative text has another step's index")
            check_time(step.seconds, f"plain step {number} along the speculative text")
    # A run writes at most its max new tokens, each cycle at least one of them (so it has at most
    # that many cycles), and its baseline one per step.
    emitted = sum(len(c.emitted) for c in cycles)
    if max(emitted, len(steps)) > settings.max_new_tokens:
        raise ValueError(f"it holds {max(emitted, len(steps))} tokens, more than its max new tokens "
                         f"({settings.max_new_tokens})")
    target, draft = fields_.get("target", {}), fields_.get("draft", {})
    if fields_["prompt_tokens"] < 0 or min(target.get("parameters", 0), draft.get("parameters", 0)) < 0:
        raise ValueError("a count is negative")
    run = Run(settings=settings, prompt=fields_["prompt"],
              target_name=target.get("name", "?"), draft_name=draft.get("name", "?"),
              target_parameters=target.get("parameters", 0), draft_parameters=draft.get("parameters", 0),
              dtype=fields_["dtype"], device=fields_["device"], clock=fields_["clock"],
              prompt_tokens=fields_["prompt_tokens"], eos_token_ids=fields_.get("eos_token_ids", []),
              baseline=fields_.get("baseline", bool(steps)), cycles=cycles, texts=texts, steps=steps,
              step_texts=step_texts, spec_done=fields_.get("spec_done", True),
              plain_done=fields_.get("plain_done", True), host_load=HostLoad.from_dict(record.get("summary")),
              followed=followed,
              note=fields_.get("note", ""), **_wall_clock_figures(record.get("summary")))
    return run, fields_.get("label") or f"{run.target_name} + {run.draft_name}"


def _wall_clock_figures(summary: dict | None) -> dict:
    """A recorded run's wall-clock figures: its elapsed time, calibration and time to the first token
    (recordings made before they were kept have none)."""
    calibrated = summary.get("calibrated") if isinstance(summary, dict) else None
    first = recorded_seconds(summary, "first_token_wall_seconds", "time to the first token")
    return dict(elapsed_wall_seconds=recorded_seconds(summary, "elapsed_wall_seconds", "elapsed wall time"),
                calibration_seconds=recorded_seconds(summary, "calibration_seconds", "calibration time") or 0.0,
                calibrated=[str(c) for c in calibrated] if isinstance(calibrated, list) else [],
                first_token_wall_seconds=first)


class _Model(TypedDict, total=False):
    name: str
    parameters: int


class _RunFields(TypedDict, total=False):
    """A run's scalar fields, as the file must have them."""
    label: str
    prompt: str
    note: str
    target: _Model
    draft: _Model
    dtype: str
    device: str
    clock: str
    prompt_tokens: int
    eos_token_ids: list[int]
    baseline: bool
    spec_done: bool
    plain_done: bool


_RUN_FIELDS = pydantic.TypeAdapter(_RunFields)
_RUN_FIELDS_NAMES = tuple(_RunFields.__annotations__)


# ----------------------------------------------------------------------------- playing back

def timeline(recorded: Run) -> list[tuple[float, Cycle | Step]]:
    """The run's events in the order its race showed them, each with the time it ended on its own
    method's clock (seconds since that method started): replay at speed s shows an event at t / s."""
    order = list(interleave(iter(recorded.cycles), iter(recorded.steps) if recorded.steps else None))
    spec = plain = 0.0
    events = []
    for event in order:
        if isinstance(event, Cycle):
            spec += event.seconds
            events.append((spec, event))
        else:
            plain += event.seconds
            events.append((plain, event))
    return events


def playback_scale(events: Sequence[tuple[float, Cycle | Step]], speed: float) -> float:
    """What turns an event's recorded time into its wall time from the replay's start, at `speed`:
    1 / speed, or less when the replay would take longer than MAX_PLAYBACK_SECONDS. A long
    recording is compressed uniformly, so its race keeps its shape and no replay holds a slot longer."""
    end = max((seconds for seconds, _ in events), default=0.0)
    return min(1.0 / speed, MAX_PLAYBACK_SECONDS / end) if end > 0 else 1.0 / speed


def replay(recorded: Run, events: list[tuple[float, Cycle | Step]] | None = None) -> Iterator[tuple[float, Run]]:
    """Play a finished run back: yields (time on the event's clock, the run so far) after each event
    of `events` (default: its whole `timeline`), one fresh `Run` growing as it did live. After the
    whole timeline it equals `recorded` in every number. A run with no events is yielded once."""
    run = dataclasses.replace(recorded, cycles=[], texts=[], steps=[], step_texts=[], spec_done=False,
                              plain_done=False, elapsed_wall_seconds=None, followed=None, _stats=(-1, None),
                              _speed=((-1, -1), None))
    texts = dict(zip(map(id, recorded.cycles), recorded.texts))
    step_texts = dict(zip(map(id, recorded.steps), recorded.step_texts))
    events = timeline(recorded) if events is None else events
    if not events:
        run.spec_done, run.plain_done = recorded.spec_done, recorded.plain_done
        yield 0.0, run
    for seconds, event in events:
        if isinstance(event, Cycle):
            run.cycles.append(event)
            run.texts.append(texts[id(event)])
            run.spec_done = len(run.cycles) == len(recorded.cycles) and recorded.spec_done
        else:
            run.steps.append(event)
            run.step_texts.append(step_texts[id(event)])
            run.plain_done = len(run.steps) == len(recorded.steps) and recorded.plain_done
        if run.done:    # the recorded race's wall time is its whole length's, and plain decoding along the
            # speculative text came after the race: said once it has all played
            run.elapsed_wall_seconds, run.followed = recorded.elapsed_wall_seconds, recorded.followed
        yield seconds, run


def up_to_cycle(recorded: Run, cycles: int) -> Run:
    """The run as its replay shows it once `cycles` speculative cycles have been played (and the
    plain steps before the next cycle)."""
    events = timeline(recorded)
    cycle_places = [i for i, (_, event) in enumerate(events) if isinstance(event, Cycle)]
    end = cycle_places[cycles] if cycles < len(cycle_places) else len(events)
    *_, (_, run) = replay(recorded, events[:end])
    return run
