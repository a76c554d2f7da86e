"""GPU health from nvidia-smi (no torch): the query the doctor runs while the GPUs are busy,
its parser and what counts as a problem.

Verified only on GPU hosts: the CPU sandbox has no nvidia-smi; the parser is unit-tested on
captured ``--format=csv,noheader,nounits`` text.
"""

from __future__ import annotations

import csv
import io
import shutil
import subprocess

# (field, key in the parsed record); the order is nvidia-smi's column order.
FIELDS = (
    ("index", "index"),
    ("name", "name"),
    ("pci.bus_id", "bus_id"),
    ("temperature.gpu", "temperature_c"),
    ("clocks.sm", "sm_clock_mhz"),
    ("clocks.max.sm", "sm_clock_max_mhz"),
    ("pcie.link.gen.current", "pcie_gen"),
    ("pcie.link.gen.max", "pcie_gen_max"),
    ("pcie.link.width.current", "pcie_width"),
    ("pcie.link.width.max", "pcie_width_max"),
    ("ecc.errors.uncorrected.volatile.total", "ecc_uncorrected"),
    ("ecc.errors.corrected.volatile.total", "ecc_corrected"),
    ("power.draw", "power_w"),
    ("power.limit", "power_limit_w"),
)
QUERY = [
    "nvidia-smi",
    "--query-gpu=" + ",".join(f for f, _ in FIELDS),
    "--format=csv,noheader,nounits",
]
TEXT_KEYS = {"name", "bus_id"}
# Under load an SM clock below this share of its maximum means power, thermal or a set cap.
CLOCK_RATIO = 0.9


def _value(key: str, raw: str) -> object:
    raw = raw.strip()
    if key in TEXT_KEYS:
        return raw
    if not raw or raw.startswith("[") or raw.upper() in ("N/A", "NOT SUPPORTED"):
        return None  # [N/A], [Not Supported], [Unknown Error]: the card does not report it
    try:
        number = float(raw)
    except ValueError:
        return None
    return int(number) if number.is_integer() else number


def parse_query(text: str) -> list[dict]:
    """One record per GPU from ``nvidia-smi --query-gpu=<FIELDS> --format=csv,noheader,nounits``.

    ValueError for a line with another number of columns (an older driver that lacks a field
    prints an error instead of rows)."""
    gpus = []
    for row in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(FIELDS):
            raise ValueError(
                f"nvidia-smi: {len(row)} columns, expected {len(FIELDS)}: {','.join(row)}"
            )
        gpus.append({key: _value(key, raw) for (_, key), raw in zip(FIELDS, row, strict=True)})
    return gpus


def problems(gpu: dict) -> list[str]:
    """What in one GPU's record (taken under load) slows training or hints at a failing card."""
    found = []
    if (gpu.get("ecc_uncorrected") or 0) > 0:
        found.append(f"{gpu['ecc_uncorrected']} uncorrected ECC errors")
    clock, top = gpu.get("sm_clock_mhz"), gpu.get("sm_clock_max_mhz")
    if clock is not None and top and clock < CLOCK_RATIO * top:
        found.append(f"SM clock {clock} of {top} MHz (power, thermal or an application clock cap)")
    width, widest = gpu.get("pcie_width"), gpu.get("pcie_width_max")
    if width is not None and widest and width < widest:
        found.append(f"PCIe link x{width} of x{widest}")
    gen, top_gen = gpu.get("pcie_gen"), gpu.get("pcie_gen_max")
    if gen is not None and top_gen and gen < top_gen:
        found.append(f"PCIe gen {gen} of {top_gen}")
    return found


def health(text: str) -> list[dict]:
    """Parsed records, each with its ``problems`` list."""
    return [{**gpu, "problems": problems(gpu)} for gpu in parse_query(text)]


def sample(timeout: float = 20.0) -> list[dict] | None:
    """Query nvidia-smi now; None where there is no nvidia-smi in the container."""
    if shutil.which(QUERY[0]) is None:
        return None
    done = subprocess.run(QUERY, capture_output=True, text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise ValueError(
            f"nvidia-smi exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
        )
    return health(done.stdout)
