"""report.png: loss (left axis, blue) and img/s of all ranks (right axis, orange) over steps,
drawn with Pillow (an image without it gets no plot). The same rows give the same bytes."""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

W, H, LEFT, RIGHT, TOP, BOTTOM = 900, 500, 80, 90, 50, 60
BLUE, ORANGE, GREY, BLACK = (31, 119, 180), (255, 127, 14), (225, 225, 225), (0, 0, 0)
RED = (214, 39, 40)


def _finite(value: object) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


def series(rows: list[dict], key: str) -> list[tuple[float, float]]:
    """(step, value) of the rows that have both, finite (a diverged loss is NaN)."""
    pairs = [(_finite(r.get("step")), _finite(r.get(key))) for r in rows]
    return [(s, v) for s, v in pairs if s is not None and v is not None]


def ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round values (1, 2 or 5 x 10^n apart) from lo to hi, about count of them."""
    raw = (hi - lo) / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw)
    first = math.ceil(lo / step - 1e-9)
    return [round(i * step, 12) for i in range(first, math.floor(hi / step + 1e-9) + 1)]


def _span(values: list[float]) -> tuple[float, float]:
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.05 or abs(hi) * 0.1 or 1.0
    return lo - pad, hi + pad


def render_png(run_id: str, rows: list[dict], marks: Sequence[tuple[float, str]] = ()) -> bytes:
    """The plot, a red line at each of ``marks`` (step, label: the restarts) in it. Raises
    ImportError without Pillow."""
    from PIL import Image, ImageDraw, ImageFont  # noqa: PLC0415 - only the plot needs it

    try:
        font = ImageFont.load_default(size=14)
    except (ImportError, OSError):  # a Pillow without FreeType: its bitmap font
        font = ImageFont.load_default()
    img = Image.new("RGB", (W, H), "white")
    draw = ImageDraw.Draw(img)
    x0, x1, y0, y1 = LEFT, W - RIGHT, TOP, H - BOTTOM  # plot area; y0 at the top

    def text(xy: tuple[float, float], s: str, fill: tuple, align: str = "l") -> None:
        left, top, right, bottom = draw.textbbox((0, 0), s, font=font)
        dx = {"l": 0, "c": (right - left) / 2, "r": right - left}[align]
        draw.text((xy[0] - dx - left, xy[1] - (bottom + top) / 2), s, fill=fill, font=font)

    loss, rate = series(rows, "loss"), series(rows, "images_per_sec")
    steps = [s for s, _ in loss + rate] or [0.0, 1.0]
    sx = _span(steps)

    def xpos(step: float) -> float:
        return x0 + (step - sx[0]) / (sx[1] - sx[0]) * (x1 - x0)

    for step in ticks(*sx):
        draw.line([(xpos(step), y0), (xpos(step), y1)], fill=GREY)
        text((xpos(step), y1 + 14), f"{step:g}", BLACK, "c")
    for points, color, side in ((loss, BLUE, -1), (rate, ORANGE, 1)):
        if not points:
            continue
        sy, axis = _span([v for _, v in points]), x0 if side < 0 else x1

        def ypos(v: float, sy: tuple[float, float] = sy) -> float:
            return y1 - (v - sy[0]) / (sy[1] - sy[0]) * (y1 - y0)

        for v in ticks(*sy):
            draw.line([(axis, ypos(v)), (axis + 5 * side, ypos(v))], fill=color)
            text((axis + 8 * side, ypos(v)), f"{v:g}", color, "r" if side < 0 else "l")
        xy = [(xpos(s), ypos(v)) for s, v in points]
        draw.line(xy, fill=color, width=2)
        for x, y in xy if len(xy) == 1 else []:  # one row: a dot
            draw.ellipse([x - 3, y - 3, x + 3, y + 3], fill=color)
    for step, label in marks:
        if sx[0] <= step <= sx[1]:
            draw.line([(xpos(step), y0), (xpos(step), y1)], fill=RED, width=2)
            text((xpos(step) + 4, y0 + 12), label, RED, "l")
    draw.rectangle([x0, y0, x1, y1], outline=BLACK)
    text(((x0 + x1) / 2, 18), f"ddpfleet run {run_id}", BLACK, "c")
    text((x0, y0 - 12), "loss", BLUE, "l")
    text((x1, y0 - 12), "images / s (all ranks)", ORANGE, "r")
    text(((x0 + x1) / 2, H - 18), "step", BLACK, "c")
    out = io.BytesIO()
    img.save(out, format="PNG")
    return out.getvalue()
