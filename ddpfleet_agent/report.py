"""How a run ended: its status word (progress.json's ``status``), and for a completed run
``report.txt`` (the table train.yml and status.yml show) and ``report.png`` (loss, left axis,
blue, and img/s of all ranks, right axis, orange, over steps: drawn with Pillow, an image without
it gets no plot; the same rows give the same bytes), written by node rank 0's agent.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path

from ddpfleet_agent.files import read_json, write_bytes_atomic
from ddpfleet_agent.ranks import finite, number
from ddpfleet_agent.reader import regular

METRICS_MAX = 64 << 20  # bytes of metrics.jsonl read for the plot
W, H, LEFT, RIGHT, TOP, BOTTOM = 900, 500, 80, 90, 50, 60
BLUE, ORANGE, GREY, BLACK = (31, 119, 180), (255, 127, 14), (225, 225, 225), (0, 0, 0)
RED = (214, 39, 40)


def run_status(hosts: list[str], outcomes: dict[str, str], failed: bool) -> str:
    """The run's status word from each host's exit outcome: failed once a failure was claimed
    (its host's agent may have died with it); else, with every outcome known, completed (all),
    stopped (the others completed) or failed; else unknown."""
    if failed:
        return "failed"
    known = {outcomes.get(h) for h in hosts}
    if None in known:
        return "unknown"
    if known == {"completed"}:
        return "completed"
    return "stopped" if known <= {"completed", "stopped"} else "failed"


def shown(value: object, fmt: str, unit: str = "") -> str:
    """value as ``fmt`` (and ``unit``) when it is a number, else ?."""
    return "?" if number(value) is None else format(value, fmt) + unit


def report_lines(
    summary: dict, ratio: float = 0.9, hosts: list[str] | None = None, nproc: int = 1
) -> list[str]:
    """Each rank's host, batch share and img/s, then totals, loss, accuracy, wall time and the
    restarts. A rank below ratio x the median img/s per image of its batch is a straggler (with
    train_balance a smaller share is none)."""
    per_rank = summary.get("per_rank_images_per_sec") or []
    if isinstance(per_rank, dict):
        per_rank = [per_rank[k] for k in sorted(per_rank, key=int)]
    rates = [number(r) for r in per_rank]
    batches = [number(b) for b in summary.get("per_rank_batch") or []]
    if len(batches) != len(rates) or None in batches or not all(batches):
        batches = [1.0] * len(rates)  # unknown shares (an older summary): equal
    paced = [None if r is None else r / b for r, b in zip(rates, batches, strict=True)]
    known = [p for p in paced if p is not None]
    median = statistics.median(known) if known else 0.0
    width = max([4, *(len(h) for h in hosts or [])])
    lines = [f"{'rank':>6}  {'host':<{width}}  {'batch':>11}  {'img/s':>10}  note"]
    for rank, (rate, pace, batch) in enumerate(zip(rates, paced, batches, strict=True)):
        node = rank // max(nproc, 1)
        host = hosts[node] if hosts and node < len(hosts) else "?"
        share = f"{batch:g} ({100 * batch / sum(batches):.0f}%)"
        share = share if "per_rank_batch" in summary else "?"
        slow = pace is not None and pace < ratio * median
        note = f"STRAGGLER ({pace / median:.2f}x median)" if slow else ""
        row = f"{rank:>6}  {host:<{width}}  {share:>11}  {shown(rate, '.1f'):>10}  {note}"
        lines.append(row.rstrip())
    lines.append(f"{'total':>6}  {shown(summary.get('images_per_sec'), '.1f'):>10}")
    lines.append(
        f"status {summary.get('status', '?')}, steps {summary.get('steps', '?')}, "
        f"world size {summary.get('world_size', '?')}, "
        f"final loss {shown(summary.get('final_loss'), '.4f')}, "
        f"final accuracy {shown(summary.get('final_accuracy'), '.4f')}, "
        f"wall time {shown(summary.get('wall_time_sec'), '.1f', 's')}"
    )
    for n, a, change in restarts(summary.get("attempts")):
        where = f", on {len(a.get('hosts') or [])} hosts: {change}" if change else ""
        healed = f"healed in {a.get('heal_sec')} s{where}"
        lines.append(f"restart {n} at step {a.get('from_step')} ({healed}) after: {a.get('cause')}")
    return lines


def restarts(attempts: object) -> list[tuple[int, dict, str]]:
    """(n, start, how its hosts differ from the last one's: 'without node3', 'node3 back',
    both or '') for each start after the first of an ``attempts`` list (restarts.py, regrow.py)."""
    starts = [a for a in attempts if isinstance(a, dict)] if isinstance(attempts, list) else []
    found = []
    for n, (before, a) in enumerate(itertools.pairwise(starts), 1):
        was, now = before.get("hosts") or [], a.get("hosts") or []
        gone, back = [h for h in was if h not in now], [h for h in now if h not in was]
        change = [f"without {', '.join(gone)}"] if gone else []
        change += [f"{', '.join(back)} back"] if back else []
        found.append((n, a, "; ".join(change)))
    return found


def program_lines(summary: dict, tail: int = 5) -> list[str]:
    """A user's program: each host's exit, the wall time, the last lines of node rank 0's log."""
    hosts = summary.get("hosts") or {}
    lines = [f"{'host':<16}  {'exit':>5}  outcome"]
    for host, rec in hosts.items():
        code = rec.get("exit_code")
        lines.append(f"{host:<16}  {'?' if code is None else code:>5}  {rec.get('outcome', '?')}")
    lines.append(
        f"program {summary.get('program', '?')}: status {summary.get('status', '?')}, "
        f"world size {summary.get('world_size', '?')}, "
        f"wall time {shown(summary.get('wall_time_sec'), '.1f', 's')}"
    )
    first = next(iter(hosts.values()), {})
    last = (first.get("log_tail") or [])[-tail:] if tail else []
    if last:
        lines.append(f"last lines of {next(iter(hosts))}'s log:")
        lines.extend(f"  {line}" for line in last)
    return lines


def read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl's rows with a numeric step (torn lines skipped); [] unless a regular file."""
    rows = []
    for line in (regular(None, path, METRICS_MAX) or b"").decode("utf-8", "replace").splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return [r for r in rows if isinstance(r, dict) and number(r.get("step")) is not None]


def write_report(run_dir: Path, run_id: str, hosts: list[str], nproc: int, ratio: float) -> str:
    """report.txt from summary.json, report.png from metrics.jsonl (none without step rows or
    Pillow), each written whole; returns a line for the agent's log."""
    summary = read_json(run_dir / "summary.json")
    program = "program" in summary
    lines = program_lines(summary) if program else report_lines(summary, ratio, hosts, nproc)
    write_bytes_atomic(run_dir / "report.txt", ("\n".join(lines) + "\n").encode())
    rows = read_metrics(run_dir / "metrics.jsonl")
    if not rows:
        return "report.txt written (no metrics rows: no report.png)"
    marks = [
        (float(a["from_step"]), f"restart {n}" + (f": {change}" if change else ""))
        for n, a, change in restarts(summary.get("attempts"))
        if number(a.get("from_step")) is not None
    ]
    try:
        png = render_png(run_id, rows, marks)
    except ImportError as exc:
        return f"report.txt written; report.png not drawn: {exc}"
    write_bytes_atomic(run_dir / "report.png", png)
    return "report.txt and report.png written"


def series(rows: list[dict], key: str) -> list[tuple[float, float]]:
    """(step, value) of the rows that have both, finite (a diverged loss is NaN)."""
    pairs = [(finite(r.get("step")), finite(r.get(key))) for r in rows]
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
    """The plot, a red line at each of ``marks`` (step, label); ImportError without Pillow."""
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
