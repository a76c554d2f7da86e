#!/usr/bin/python
"""Turn a run's summary and metrics into the end-of-run table and a PNG (controller side)."""

from __future__ import annotations

import base64
import io
import json

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_run import report_lines, series, stragglers

DOCUMENTATION = r"""
module: ddpfleet_run_report
short_description: Build the report table and the loss/throughput PNG of a ddpfleet run
description:
- Runs on the controller (it needs matplotlib from the controller's venv); returns the table
  lines, the straggler ranks and the PNG as base64 for the caller to store in the run directory.
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
author: ddpfleet
"""

RETURN = r"""
lines:
  description: The table, one line per item.
  type: list
  returned: always
stragglers:
  description: Straggler ranks.
  type: list
  returned: always
png_b64:
  description: The plot (PNG, base64); empty when metrics has no step records.
  type: str
  returned: always
"""


LOSS_KEYS = ("loss", "train_loss")
RATE_KEYS = ("images_per_sec", "img_per_sec", "throughput")


def render_png(run_id: str, records: list[dict]) -> bytes:
    """Loss (left axis) and img/s (right axis) over steps."""
    import matplotlib  # noqa: PLC0415 - only the controller needs it, and only here

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    loss_x, loss_y = series(records, LOSS_KEYS)
    rate_x, rate_y = series(records, RATE_KEYS)
    fig, ax_loss = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax_loss.plot(loss_x, loss_y, color="tab:blue", label="loss")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss", color="tab:blue")
    ax_rate = ax_loss.twinx()
    ax_rate.plot(rate_x, rate_y, color="tab:orange", label="img/s")
    ax_rate.set_ylabel("images / s (all ranks)", color="tab:orange")
    ax_loss.set_title(f"ddpfleet run {run_id}")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "run_id": {"type": "str", "required": True},
            "summary": {"type": "dict", "required": True},
            "metrics": {"type": "str", "default": ""},
            "straggler_ratio": {"type": "float", "default": 0.9},
        },
        supports_check_mode=True,
    )
    p = module.params
    records = []
    for line in p["metrics"].splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if isinstance(rec, dict):
            records.append(rec)
    png = b""
    if any(isinstance(r.get("step"), (int, float)) for r in records):
        try:
            png = render_png(p["run_id"], records)
        except ImportError as exc:
            module.fail_json(msg=f"matplotlib is needed on the controller for report.png: {exc}")
    module.exit_json(
        changed=False,
        lines=report_lines(p["summary"], p["straggler_ratio"]),
        stragglers=stragglers(p["summary"], p["straggler_ratio"]),
        png_b64=base64.b64encode(png).decode(),
    )


if __name__ == "__main__":
    main()
