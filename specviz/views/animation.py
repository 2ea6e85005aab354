"""A recorded race as an animation: GIF (Pillow) or MP4 (H.264 through the ffmpeg that imageio-ffmpeg
ships), for a slide, a lecture page or a blog post.

Each frame draws, with PIL, what the Run tab draws as HTML, from the same view model: the token
pieces of `render.cycle_pieces` (verdict, colour, mark), the status lines of `render.race_status`,
the speedup's figure and sentence of `prose.speedup_headline`, `run_view.describe`. Only the drawing
is new here; which token is what, and every number, comes from the code the app renders with.

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

from PIL import Image, ImageDraw, ImageFont

from ..core.events import ACCEPTED, BONUS, REJECTED, RESAMPLED
from ..errors import SpecvizError
from ..runs import recording
from ..runs.result import Run
from . import render
from .prose import speedup_caption, speedup_headline
from .run_view import describe

FORMATS = (".gif", ".mp4")
DEFAULT_SIZE = (1280, 720)           # a projector
MIN_SIZE, MAX_SIZE = (320, 180), (1920, 1080)
FRAME_SECONDS = 0.04                 # the frame grid: 25 frames a second (the MP4's rate)
MP4_FPS = 25
HOLD_SECONDS = 4.0                   # the finished race stays this long
PALETTE_COLOURS = 96                 # a GIF's colours: the verdict tints, their marks, text and its anti-aliasing
MAX_FRAMES = 300                     # drawn frames (a GIF holds them all in memory: ~0.9 MB each at 1280x720)

WHITE, INK, GREY, LINE = (255, 255, 255), (24, 24, 27), (96, 96, 104), (190, 190, 196)


def _rgb(colour: str) -> tuple[int, int, int]:
    return tuple(int(colour[i:i + 2], 16) for i in (1, 3, 5))


def _over_white(colour: str, alpha: float) -> tuple[int, int, int]:
    return tuple(round(255 + (c - 255) * alpha) for c in _rgb(colour))


# The token view's colours (render.CSS): a verdict's tint behind its text, its colour for its mark.
COLOUR = {v: _rgb(c) for v, c in render.COLOURS.items()}
TINT = {ACCEPTED: _over_white(render.COLOURS[ACCEPTED], 0.22), REJECTED: _over_white(render.COLOURS[REJECTED], 0.18),
        RESAMPLED: _over_white(render.COLOURS[RESAMPLED], 0.35), BONUS: _over_white(render.COLOURS[BONUS], 0.22)}
EARLIER = _rgb(render.EARLIER_COLOUR)


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


# ----------------------------------------------------------------------------- fonts

def _font(names: tuple[str, ...], size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    """The first of `names` that FreeType finds (Pillow looks in the system's font folders too), or
    Pillow's own default font."""
    for name in names:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size)


class Fonts:
    def __init__(self, unit: float):
        sans = ("DejaVuSans.ttf", "LiberationSans-Regular.ttf")
        bold = ("DejaVuSans-Bold.ttf", "LiberationSans-Bold.ttf")
        mono = ("DejaVuSansMono.ttf", "LiberationMono-Regular.ttf")
        mono_bold = ("DejaVuSansMono-Bold.ttf", "LiberationMono-Bold.ttf")
        self.title = _font(bold, round(24 * unit))
        self.small = _font(sans, round(15 * unit))
        self.head = _font(bold, round(19 * unit))
        self.status = _font(sans, round(16 * unit))
        self.token = _font(mono, round(19 * unit))
        self.token_bold = _font(mono_bold, round(19 * unit))
        self.big = _font(bold, round(58 * unit))
        self.tile = _font(bold, round(30 * unit))
        self.line = _font(bold, round(19 * unit))


def _fit(draw: ImageDraw.ImageDraw, text: str, font, width: float) -> str:
    """`text` cut (with an ellipsis) to `width` pixels."""
    if draw.textlength(text, font=font) <= width:
        return text
    while text and draw.textlength(text + "\u2026", font=font) > width:
        text = text[:-max(1, len(text) // 8)]
    return text + "\u2026"


# ----------------------------------------------------------------------------- the token panes

# An item of a pane's text: (text, verdict or None, bold, earlier) for a token, or the strings
# "cycle" (the bar that starts a cycle) and "newline".
def _token_items(text: str, verdict: str | None = None, earlier: bool = False) -> list:
    bold = verdict in (RESAMPLED, BONUS)
    items: list = []
    for number, part in enumerate(text.split("\n")):
        if number:
            items += [("\u21b5", verdict, False, earlier), "newline"]
        if part:
            items.append((part, verdict, bold, earlier))
    return items or [("", verdict, bold, earlier)]


def _tail(items: list, characters: int) -> list:
    """The last items holding about `characters` characters (a pane shows the end of its text)."""
    kept, count = [], 0
    for item in reversed(items):
        kept.append(item)
        count += len(item[0]) if isinstance(item, tuple) else 1
        if count >= characters:
            break
    return kept[::-1]


def _layout(draw, items: list, fonts: Fonts, width: float) -> list[list[tuple[float, object]]]:
    """Items wrapped into lines of `width` pixels: each line a list of (x, item)."""
    lines: list[list] = [[]]
    x = 0.0
    for item in items:
        if item == "newline":
            lines.append([])
            x = 0.0
            continue
        if item == "cycle":
            if x + 8 > width:
                lines.append([])
                x = 0.0
            lines[-1].append((x, item))
            x += 6
            continue
        text, verdict, bold, earlier = item
        font = fonts.token_bold if bold else fonts.token
        while True:      # a token wider than what is left of the line goes on the next; wider than a line, split
            length = draw.textlength(text, font=font) if text else 6
            if x + length <= width or (x == 0 and len(text) <= 1):
                lines[-1].append((x, (text, verdict, bold, earlier)))
                x += length + 1
                break
            if x > 0 and length <= width:
                lines.append([])
                x = 0.0
                continue
            cut = max(1, int(len(text) * (width - x) / length))
            lines[-1].append((x, (text[:cut], verdict, bold, earlier)))
            lines.append([])
            x, text = 0.0, text[cut:]
    return lines


def _draw_pane(draw, box, title: str, status: str, items: list, fonts: Fonts, unit: float, *, legend: bool) -> None:
    left, top, right, bottom = box
    draw.rounded_rectangle(box, radius=round(8 * unit), outline=LINE, width=max(1, round(unit)), fill=WHITE)
    pad = 12 * unit
    draw.text((left + pad, top + pad), title, font=fonts.head, fill=INK)
    status = _fit(draw, status, fonts.status, right - left - 3 * pad - draw.textlength(title, font=fonts.head))
    draw.text((right - pad, top + pad + 2 * unit), status, font=fonts.status, fill=GREY, anchor="ra")
    y = top + pad + 30 * unit
    if legend:
        x = left + pad
        for verdict in render.VERDICTS:
            label = render.LEGEND_TEXT[verdict].split(" (")[0].split(":")[0]
            swatch = (x, y + 2 * unit, x + 14 * unit, y + 16 * unit)
            draw.rectangle(swatch, fill=TINT[verdict], outline=COLOUR[verdict])
            draw.text((x + 18 * unit, y), label, font=fonts.small, fill=INK)
            x += 18 * unit + draw.textlength(label, font=fonts.small) + 14 * unit
        y += 26 * unit
    line_height = round(fonts.token.size * 1.65) if hasattr(fonts.token, "size") else round(30 * unit)
    inner = right - left - 2 * pad
    rows = max(1, int((bottom - pad - y) // line_height))
    lines = _layout(draw, _tail(items, int(rows * inner / max(1.0, draw.textlength("m", font=fonts.token)))),
                    fonts, inner)[-rows:]
    for row, line in enumerate(lines):
        base = y + row * line_height
        for x, item in line:
            x += left + pad
            if item == "cycle":
                draw.line((x + 2 * unit, base, x + 2 * unit, base + line_height - 4 * unit), fill=LINE,
                          width=max(1, round(2 * unit)))
                continue
            _draw_token(draw, x, base, item, fonts, unit, line_height)


def _draw_token(draw, x: float, top: float, item, fonts: Fonts, unit: float, line_height: int) -> None:
    text, verdict, bold, earlier = item
    font = fonts.token_bold if bold else fonts.token
    width = draw.textlength(text, font=font) if text else 6 * unit
    low = top + line_height - 6 * unit
    if verdict is not None:
        draw.rectangle((x, top + 1 * unit, x + width, low + 2 * unit), fill=TINT[verdict])
    colour = (110, 110, 116) if verdict == REJECTED else INK
    draw.text((x, top + 3 * unit), text, font=font, fill=colour)
    thick = max(1, round(2 * unit))
    if verdict == REJECTED:        # struck through
        middle = top + line_height * 0.45
        draw.line((x, middle, x + width, middle), fill=COLOUR[REJECTED], width=thick)
    elif verdict == RESAMPLED:     # a wavy underline
        step = 4 * unit
        points = [(x + i * step, low + (2 * unit if i % 2 else -1 * unit)) for i in range(int(width / step) + 2)]
        draw.line([(min(px, x + width), py) for px, py in points], fill=COLOUR[RESAMPLED], width=thick)
    elif verdict == BONUS:         # a double underline
        for offset in (-1 * unit, 3 * unit):
            draw.line((x, low + offset, x + width, low + offset), fill=COLOUR[BONUS], width=max(1, round(unit)))
    if earlier:                    # drafted from an earlier request's text: a line over it
        draw.line((x, top + 1 * unit, x + width, top + 1 * unit), fill=EARLIER, width=thick)


# ----------------------------------------------------------------------------- one frame

class FrameDrawer:
    """Frames of one run: each cycle's items are made once, when it arrives (the run only grows)."""

    def __init__(self, recorded: Run, size: tuple[int, int], caption: str = ""):
        self.size = size
        self.unit = min(size[0] / 1280, size[1] / 720)
        self.fonts = Fonts(self.unit)
        self.caption = caption
        self.describe = describe(recorded)
        self.spec_items: list = []
        self.cycles = 0
        self.plain_items: list = []
        self.steps = 0

    def _grow(self, run: Run) -> None:
        for cycle, text in zip(run.cycles[self.cycles:], run.texts[self.cycles:]):
            self.spec_items.append("cycle")
            for piece in render.cycle_pieces(cycle, text):
                self.spec_items += _token_items(piece.text, piece.verdict, piece.earlier)
            if cycle.is_tree:
                self.spec_items.append((f"\u2442{len(cycle.drafted)}", None, False, False))
        self.cycles = len(run.cycles)
        for text in run.step_texts[self.steps:]:
            self.plain_items += _token_items(text)
        self.steps = len(run.steps)

    def draw(self, run: Run, *, final: bool = False) -> Image.Image:
        self._grow(run)
        width, height = self.size
        unit, fonts = self.unit, self.fonts
        image = Image.new("RGB", self.size, (246, 246, 248))
        draw = ImageDraw.Draw(image)
        margin = 20 * unit
        draw.text((margin, margin), "Speculative decoding races plain decoding", font=fonts.title, fill=INK)
        draw.text((margin, margin + 34 * unit), _fit(draw, self.describe, fonts.small, width - 2 * margin),
                  font=fonts.small, fill=GREY)
        top, bottom = margin + 62 * unit, height - 150 * unit
        middle = width / 2
        spec_status = render.race_status(run.stats.tokens, run.stats.seconds, run.spec_done)
        plain_seconds = run.plain.seconds if run.plain else 0.0
        plain_status = render.race_status(len(run.steps), plain_seconds, run.plain_done)
        _draw_pane(draw, (margin, top, middle - 6 * unit, bottom), "Speculative decoding", spec_status,
                   self.spec_items, fonts, unit, legend=True)
        _draw_pane(draw, (middle + 6 * unit, top, width - margin, bottom), "Plain decoding (baseline)", plain_status,
                   self.plain_items, fonts, unit, legend=False)
        self._draw_numbers(draw, run, (margin, bottom + 12 * unit, width - margin, height - margin), final)
        return image

    def _draw_numbers(self, draw, run: Run, box, final: bool) -> None:
        """The speedup large, acceptance and tokens per pass beside it, the headline under them."""
        left, top, right, bottom = box
        unit, fonts = self.unit, self.fonts
        big, headline = speedup_headline(run)
        spec = run.stats
        tiles = [(big, speedup_caption(run), fonts.big, COLOUR[BONUS]),
                 (f"{spec.draft_acceptance_rate:.0%}" if spec.drafted else "\u2013",
                  f"of drafted tokens accepted ({spec.accepted} of {spec.drafted})", fonts.tile, INK),
                 (f"{spec.mean_acceptance_length:.2f}" if spec.cycles else "\u2013",
                  f"tokens per target pass ({spec.tokens} in {spec.cycles})", fonts.tile, INK)]
        widths = [0.36, 0.32, 0.32]
        x = left
        tile_bottom = bottom - 34 * unit
        for (value, caption, font, colour), share in zip(tiles, widths):
            span = (right - left) * share - 8 * unit
            outline = COLOUR[BONUS] if font is fonts.big else LINE
            draw.rounded_rectangle((x, top, x + span, tile_bottom), radius=round(8 * unit), fill=WHITE,
                                   outline=outline, width=max(1, round((2 if font is fonts.big else 1) * unit)))
            draw.text((x + 12 * unit, (top + tile_bottom) / 2 - 8 * unit), value, font=font, fill=colour, anchor="lm")
            draw.text((x + 12 * unit, tile_bottom - 8 * unit), _fit(draw, caption, fonts.small, span - 24 * unit),
                      font=fonts.small, fill=GREY, anchor="ls")
            x += span + 12 * unit
        line = headline + (render.outputs_text(run) if final else "")
        if final:
            line = "Finished. " + line
        line = _fit(draw, line + (f"  \u00b7  {self.caption}" if self.caption else ""), fonts.line, right - left)
        draw.text((left, bottom), line, font=fonts.line, fill=INK, anchor="ls")


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
