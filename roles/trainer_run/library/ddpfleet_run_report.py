#!/usr/bin/python
"""Turn a run's summary and metrics into the end-of-run table and a PNG (controller side)."""

from __future__ import annotations

import io
import json
import statistics

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: ddpfleet_run_report
short_description: Build the report table and the loss/throughput PNG of a ddpfleet run
description:
- Runs on the controller (it needs matplotlib from the controller's venv); returns the table
  lines and writes the plot to C(png_path) for the caller to copy
  into the run directory. The same inputs give the same PNG bytes.
options:
  run_id:
    description: The run id (plot title).
    type: str
    required: true
  summary:
    description: Parsed summary.json.
    type: dict
    required: true
  metrics:
    description: Text of metrics.jsonl.
    type: str
    default: ''
  straggler_ratio:
    description: A rank below this fraction of the median img/s is a straggler.
    type: float
    default: 0.9
  hosts:
    description: The run's hosts in node-rank order (the table names each rank's host).
    type: list
    elements: str
    default: []
  nproc:
    description: Processes per host (rank // nproc is the node rank).
    type: int
    default: 1
  png_path:
    description: Where to write the plot on the controller (nothing when metrics has no steps).
    type: path
    required: true
author: ddpfleet
"""

RETURN = r"""
lines:
  description: The table, one line per item.
  type: list
  returned: always
png:
  description: Whether png_path was written.
  type: bool
  returned: always
"""


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def report_lines(
    summary: dict, ratio: float = 0.9, hosts: list[str] | None = None, nproc: int = 1
) -> list[str]:
    """Table of each rank's host, batch share and img/s (a rank below ratio x the median img/s
    per image of its batch flagged as a straggler: with train_balance a smaller share is no
    straggler) plus totals, loss, accuracy and wall time."""
    per_rank = summary.get("per_rank_images_per_sec") or []
    if isinstance(per_rank, dict):
        per_rank = [per_rank[k] for k in sorted(per_rank, key=int)]
    rates = [_num(r) for r in per_rank]
    batches = [_num(b) for b in summary.get("per_rank_batch") or []]
    if len(batches) != len(rates) or None in batches or not all(batches):
        batches = [1.0] * len(rates)  # unknown shares (an older summary): equal
    paced = [None if r is None else r / b for r, b in zip(rates, batches, strict=True)]
    known = [p for p in paced if p is not None]
    median = statistics.median(known) if known else 0.0
    global_batch = sum(batches)
    width = max([4, *(len(h) for h in hosts or [])])
    lines = [f"{'rank':>6}  {'host':<{width}}  {'batch':>11}  {'img/s':>10}  note"]
    for rank, (rate, pace, batch) in enumerate(zip(rates, paced, batches, strict=True)):
        host = hosts[rank // max(nproc, 1)] if hosts and rank // max(nproc, 1) < len(hosts) else "?"
        share = (
            f"{batch:g} ({100 * batch / global_batch:.0f}%)" if "per_rank_batch" in summary else "?"
        )
        shown = f"{rate:10.1f}" if rate is not None else f"{'?':>10}"
        slow = pace is not None and pace < ratio * median
        note = f"STRAGGLER ({pace / median:.2f}x median)" if slow else ""
        lines.append(f"{rank:>6}  {host:<{width}}  {share:>11}  {shown}  {note}".rstrip())
    total = _num(summary.get("images_per_sec"))
    lines.append(f"{'total':>6}  " + (f"{total:10.1f}" if total is not None else f"{'?':>10}"))
    loss, acc, wall = (
        _num(summary.get(k)) for k in ("final_loss", "final_accuracy", "wall_time_sec")
    )
    lines.append(
        f"status {summary.get('status', '?')}, steps {summary.get('steps', '?')}, "
        f"world size {summary.get('world_size', '?')}, "
        f"final loss {'?' if loss is None else f'{loss:.4f}'}, "
        f"final accuracy {'?' if acc is None else f'{acc:.4f}'}, "
        f"wall time {'?' if wall is None else f'{wall:.1f}s'}"
    )
    return lines


def program_lines(summary: dict, tail: int = 5) -> list[str]:
    """A user's program (summary.json written by the agents): each host's exit, the wall
    time, and the last lines of node rank 0's log."""
    hosts = summary.get("hosts") or {}
    lines = [f"{'host':<16}  {'exit':>5}  outcome"]
    for host, rec in hosts.items():
        code = rec.get("exit_code")
        lines.append(f"{host:<16}  {'?' if code is None else code:>5}  {rec.get('outcome', '?')}")
    wall = _num(summary.get("wall_time_sec"))
    lines.append(
        f"program {summary.get('program', '?')}: status {summary.get('status', '?')}, "
        f"world size {summary.get('world_size', '?')}, "
        f"wall time {'?' if wall is None else f'{wall:.1f}s'}"
    )
    first = next(iter(hosts.values()), {})
    shown = (first.get("log_tail") or [])[-tail:] if tail else []
    if shown:
        lines.append(f"last lines of {next(iter(hosts))}'s log:")
        lines.extend(f"  {line}" for line in shown)
    return lines


def series(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of the metrics records that have both."""
    pairs = [(_num(r.get("step")), _num(r.get(key))) for r in records]
    kept = [(s, v) for s, v in pairs if s is not None and v is not None]
    return [s for s, _ in kept], [v for _, v in kept]


def render_png(run_id: str, records: list[dict]) -> bytes:
    """Loss (left axis) and img/s (right axis) over steps."""
    import matplotlib  # noqa: PLC0415 - only the controller needs it, and only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax_loss = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax_loss.plot(*series(records, "loss"), color="tab:blue", label="loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss", color="tab:blue")
    ax_rate = ax_loss.twinx()
    ax_rate.plot(*series(records, "images_per_sec"), color="tab:orange", label="img/s")
    ax_rate.set_ylabel("images / s (all ranks)", color="tab:orange")
    ax_loss.set_title(f"ddpfleet run {run_id}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "summary": {"type": "dict", "required": True},
            "metrics": {"type": "str", "default": ""},
            "straggler_ratio": {"type": "float", "default": 0.9},
            "hosts": {"type": "list", "elements": "str", "default": []},
            "nproc": {"type": "int", "default": 1},
            "png_path": {"type": "path", "required": True},
        },
        supports_check_mode=False,
    )
    p = module.params
    records = []
    for line in p["metrics"].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and _num(rec.get("step")) is not None:
            records.append(rec)
    if records:
        try:
            png = render_png(p["run_id"], records)
        except ImportError as exc:
            module.fail_json(msg=f"matplotlib is needed on the controller for report.png: {exc}")
        with open(p["png_path"], "wb") as fh:
            fh.write(png)
    module.exit_json(
        changed=False,
        lines=(
            program_lines(p["summary"])
            if "program" in p["summary"]
            else report_lines(p["summary"], p["straggler_ratio"], p["hosts"], p["nproc"])
        ),
        png=bool(records),
    )


if __name__ == "__main__":
    main()
