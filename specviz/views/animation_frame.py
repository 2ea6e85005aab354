"""One frame of an animated race (`views.animation`), drawn with PIL from the token view's own
model: each cycle's `render.cycle_pieces` (verdict, tint, mark: struck through, wavy, double
underline; a bar before each cycle), each side's `render.race_status`, the speedup's figure and
sentence from `prose.speedup_headline` and the run's `run_view.describe`. Each pane shows the end of
its text, as the app's panes keep their newest line in sight."""

from __future__ import annotations

from PIL import Image, ImageDraw, ImageFont

from ..core.events import ACCEPTED, BONUS, REJECTED, RESAMPLED
from ..runs.result import Run
from . import render
from .prose import speedup_caption, speedup_headline
from .run_view import describe

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
        spec_status = render.race_status(run.stats.tokens, run.stats.seconds, run.spec_done, run.clock)
        plain_seconds = run.plain.seconds if run.plain else 0.0
        plain_status = render.race_status(len(run.steps), plain_seconds, run.plain_done, run.clock)
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
                 (f"{spec.tokens_per_cycle:.2f}" if spec.cycles else "\u2013",
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
