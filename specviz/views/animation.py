"""A recorded race as an animation: GIF (Pillow) or MP4 (H.264 through the ffmpeg that imageio-ffmpeg
ships), for a slide, a lecture page or a blog post.

Each frame (`animation_frame`) draws, with PIL, what the Run tab draws as HTML, from the same view
model: the token pieces of `render.cycle_pieces` (verdict, colour, mark), the status lines of
`render.race_status`, the speedup's figure and sentence of `prose.speedup_headline`,
`run_view.describe`. Only the drawing is new; which token is what, and every number, comes from the
code the app renders with.

Frames follow the replay (`runs.recording.replay`): an event appears at its recorded time on its own
method's clock, divided by the speed, on a grid of FRAME_SECONDS (25 frames a second; a GIF stores
hundredths, a browser plays delays of 20 ms or more as written). A long recording is compressed as
the Replay tab compresses it (`recording.playback_scale`), and a frame is drawn at most MAX_FRAMES
times (a run of thousands of events shows a frame per group of them), so an export's cost is
bounded whatever the file holds. The last frame, the finished run with its verdict line, stays
HOLD_SECONDS (a GIF then loops).
"""

from __future__ import annotations

import dataclasses
import io
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

from PIL import Image

from ..errors import SpecvizError
from ..runs import recording
from ..runs.result import Run
from .animation_frame import FrameDrawer

FORMATS = (".gif", ".mp4")
DEFAULT_SIZE = (1280, 720)           # a projector
MIN_SIZE, MAX_SIZE = (320, 180), (1920, 1080)
FRAME_SECONDS = 0.04                 # the frame grid: 25 frames a second (the MP4's rate)
MP4_FPS = 25
HOLD_SECONDS = 4.0                   # the finished race stays this long
PALETTE_COLOURS = 96                 # a GIF's colours: the verdict tints, their marks, text and its anti-aliasing
MAX_FRAMES = 300                     # drawn frames (a GIF holds them all in memory: ~0.9 MB each at 1280x720)


def parse_size(text: str) -> tuple[int, int]:
    """'1280x720' as (width, height), within MIN_SIZE and MAX_SIZE."""
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise SpecvizError(f"--size {text!r}: give width x height in pixels, such as 1280x720.") from None
    if not (MIN_SIZE[0] <= width <= MAX_SIZE[0] and MIN_SIZE[1] <= height <= MAX_SIZE[1]):
        raise SpecvizError(f"--size {text}: from {MIN_SIZE[0]}x{MIN_SIZE[1]} to {MAX_SIZE[0]}x{MAX_SIZE[1]} pixels.")
    return width, height


def check_format(path: Path, size: tuple[int, int]) -> str:
    """The animation's format from its file's extension, or a SpecvizError naming the ones that work."""
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise SpecvizError(f"--animation {path}: the format comes from the extension, and "
                           f"{suffix or 'no extension'} is not one: use {' or '.join(FORMATS)}.")
    if suffix == ".mp4" and (size[0] % 2 or size[1] % 2):
        raise SpecvizError(f"--size {size[0]}x{size[1]}: an MP4 (H.264) needs an even width and height.")
    return suffix


# ----------------------------------------------------------------------------- the frames and the files

def frames(recorded: Run, *, speed: float = 1.0, size: tuple[int, int] = DEFAULT_SIZE,
           caption: str = "") -> Iterator[tuple[float, Image.Image]]:
    """(start in seconds, image) for each frame: the empty race, then the race after each group of
    events that share a frame, then the finished run (which lasts HOLD_SECONDS after its start)."""
    events = recording.timeline(recorded)
    scale = recording.playback_scale(events, speed)
    step, slots = FRAME_SECONDS, _slots(events, scale, FRAME_SECONDS)
    while len(set(slots)) > MAX_FRAMES:       # thousands of events: a frame per group of them
        step *= 2
        slots = _slots(events, scale, step)
    drawer = FrameDrawer(recorded, size, caption)
    played = None
    for number, (_, played) in enumerate(recording.replay(recorded, events)):
        if number == 0:
            yield 0.0, drawer.draw(_empty(recorded))
        if number + 1 == len(slots):
            break
        if slots[number + 1] != slots[number]:        # the last event of its frame
            yield slots[number] * step, drawer.draw(played)
    if played is None:
        played = recorded
    yield (slots[-1] if slots else 1) * step, drawer.draw(played, final=True)


def _slots(events, scale: float, step: float) -> list[int]:
    """Each event's frame (its time over `step`, rounded up), never earlier than the event before's
    (the race's order: one method's event may end before the other's that was shown first)."""
    slots: list[int] = []
    for seconds, _ in events:
        slots.append(max(slots[-1] if slots else 1, math.ceil(seconds * scale / step - 1e-9)))
    return slots


def _empty(recorded: Run) -> Run:
    """The race before its first event."""
    *_, (_, run) = recording.replay(recorded, [])
    return dataclasses.replace(run, spec_done=False, plain_done=False)


def gif_bytes(recorded: Run, *, speed: float = 1.0, size: tuple[int, int] = DEFAULT_SIZE,
              caption: str = "") -> tuple[bytes, int, float]:
    """The race as a looping GIF: (its bytes, its frames, its length in seconds). Each frame lasts
    until the next one's start, in the GIF's hundredths of a second (rounded from the start times,
    so that rounding never accumulates)."""
    # One palette for every frame, from the finished race (it holds every colour the others do): frames
    # then differ only where the race changed, and the GIF stores only that (a fifth of the bytes of
    # a palette per frame, measured).
    final = FrameDrawer(recorded, size, caption).draw(recorded, final=True)
    palette = final.quantize(colors=PALETTE_COLOURS, method=Image.Quantize.MEDIANCUT)
    starts, images = [], []
    for start, image in frames(recorded, speed=speed, size=size, caption=caption):
        starts.append(round(start * 100))
        images.append(image.quantize(palette=palette, dither=Image.Dither.NONE))
    ends = starts[1:] + [starts[-1] + round(HOLD_SECONDS * 100)]
    durations = [10 * (end - start) for start, end in zip(starts, ends)]
    out = io.BytesIO()
    images[0].save(out, format="GIF", save_all=True, append_images=images[1:], duration=durations, loop=0)
    return out.getvalue(), len(images), ends[-1] / 100


def mp4_bytes(recorded: Run, **options) -> tuple[bytes, int, float]:
    """The race as an H.264 MP4 at MP4_FPS frames a second (a frame repeated until the next one's
    start): (its bytes, its frames, its length in seconds)."""
    import imageio_ffmpeg

    size = options.get("size", DEFAULT_SIZE)
    with tempfile.TemporaryDirectory(prefix="specviz-mp4-") as folder:
        path = Path(folder) / "race.mp4"
        writer = imageio_ffmpeg.write_frames(str(path), size, fps=MP4_FPS, codec="libx264", quality=None,
                                             macro_block_size=2, ffmpeg_log_level="error",
                                             output_params=["-preset", "veryfast", "-crf", "23",
                                                            "-movflags", "+faststart"])
        written, previous = 0, None
        try:
            writer.send(None)
            for start, image in frames(recorded, **options):
                if previous is not None:
                    written = _repeat(writer, previous, written, round(start * MP4_FPS))
                previous = image.tobytes()
                last = start
            written = _repeat(writer, previous, written, round((last + HOLD_SECONDS) * MP4_FPS))
            writer.close()
        except (OSError, RuntimeError) as error:
            raise SpecvizError(f"ffmpeg could not write the MP4: {error}") from None
        data = path.read_bytes()
    return data, written, written / MP4_FPS


def _repeat(writer, frame: bytes, written: int, until: int) -> int:
    for _ in range(max(0, until - written)):
        writer.send(frame)
    return max(written, until)


def animation_bytes(recorded: Run, suffix: str, **options) -> tuple[bytes, int, float]:
    """The race as `suffix` (.gif or .mp4): (bytes, frames, seconds)."""
    return (mp4_bytes if suffix == ".mp4" else gif_bytes)(recorded, **options)
