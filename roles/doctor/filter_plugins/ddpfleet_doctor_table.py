"""Filter of the doctor role (controller side, pure Python): the table doctor.yml prints from
the report (ddpfleet_doctor.py's ddpfleet_doctor_report)."""

from __future__ import annotations

import statistics


def _fmt(value: object, digits: int = 1) -> str:
    if value is None or value == "":
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _grid(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(
            c.ljust(w) if i in (0, len(widths) - 1) else c.rjust(w)
            for i, (c, w) in enumerate(zip(r, widths, strict=True))
        ).rstrip()
        for r in rows
    ]


_GPU_KEYS = (
    "sm_clock_mhz",
    "sm_clock_max_mhz",
    "pcie_gen",
    "pcie_width",
    "pcie_width_max",
    "ecc_uncorrected",
)


def table(doc: dict, path: str = "") -> list[str]:
    """The lines doctor.yml prints: one row per host, the median, then network and flags."""
    m, hosts = doc["model"], doc["hosts"]
    pairs = (doc.get("network") or {}).get("pairs") or []
    flagged = {}
    for f in doc["flags"]:
        for h in f["hosts"]:
            flagged.setdefault(h, []).append(f"{f['kind']} {f['ratio']:.2f}")
    rows = [
        ["host", "cpus", "dev", "img/s", "steps/s", "read MB/s", "JPEG/s", "link Gbit/s", "flags"]
    ]
    cols: dict[str, list[float]] = {"img": [], "steps": [], "read": [], "jpeg": [], "link": []}
    for host, v in hosts.items():
        c, s = v["compute"], v.get("storage") or {}
        links = [float(p["gbits_per_sec"]) for p in pairs if host in (p["a"], p["b"])]
        link = statistics.median(links) if links else None
        gpus = len(c.get("per_gpu") or [])
        for key, value in (
            ("img", c.get("images_per_sec")),
            ("steps", c.get("steps_per_sec")),
            ("read", s.get("read_mb_per_sec")),
            ("jpeg", s.get("jpegs_per_sec")),
            ("link", link),
        ):
            if value is not None:
                cols[key].append(float(value))
        rows.append(
            [
                host,
                f"{v['cpus']:g}" if v.get("cpus") else "-",
                f"{gpus} GPU" if gpus else "cpu",
                _fmt(float(c["images_per_sec"])),
                _fmt(float(c["steps_per_sec"]), 3),
                _fmt(s.get("read_mb_per_sec")),
                _fmt(s.get("jpegs_per_sec")),
                _fmt(link, 2),
                ", ".join(flagged.get(host, [])) or "ok",
            ]
        )
    med = {k: statistics.median(v) if v else None for k, v in cols.items()}
    rows.append(
        [
            "median",
            "",
            "",
            _fmt(med["img"]),
            _fmt(med["steps"], 3),
            _fmt(med["read"]),
            _fmt(med["jpeg"]),
            _fmt(med["link"], 2),
            "",
        ]
    )
    lines = [
        f"ddpfleet doctor {doc['time']}: {m['arch']} at {m['image_size']} px, "
        f"batch {m['batch_size']} per process, amp {m['amp']}, {m['device']}, {len(hosts)} hosts",
        *_grid(rows),
    ]
    for host, v in hosts.items():
        health = {g.get("index"): g for g in v["compute"].get("gpu_health") or []}
        for g in v["compute"].get("per_gpu") or []:
            h = health.get(g["gpu"], {})
            v_ = {k: _fmt(h.get(k)) for k in _GPU_KEYS}
            lines.append(
                f"  {host} gpu{g['gpu']}: {g['images_per_sec']:.1f} img/s, "
                f"SM {v_['sm_clock_mhz']}/{v_['sm_clock_max_mhz']} MHz, "
                f"PCIe gen{v_['pcie_gen']} x{v_['pcie_width']}/x{v_['pcie_width_max']}, "
                f"ECC uncorrected {v_['ecc_uncorrected']}"
                + (f": {'; '.join(h['problems'])}" if h.get("problems") else "")
            )
    ar = (doc.get("network") or {}).get("allreduce")
    if ar:
        lines.append(
            f"all-reduce {ar['size_mb']:g} MB over {ar['ranks']} ranks ({ar['backend']}): "
            f"busbw {ar['busbw_gbps']:.2f} GB/s, {ar['seconds'] * 1000:.1f} ms per all-reduce"
        )
    if pairs:
        slow = min(pairs, key=lambda p: p["gbits_per_sec"])
        lines.append(
            "links (Gbit/s): "
            + ", ".join(f"{p['a']}->{p['b']} {p['gbits_per_sec']:.2f}" for p in pairs)
            + f"; slowest {slow['a']}-{slow['b']}"
        )
    lines += doc.get("notes", [])
    lines += [f"FLAG {f['kind']} {f['subject']}: {f['cause']}" for f in doc["flags"]]
    if not doc["flags"]:
        ratio = doc["ratio"]  # the report's, always there
        lines.append(f"no flags: every host, GPU and link is at {ratio:g} of its median or better")
    if path:
        lines.append(f"JSON: {path}")
    return lines


class FilterModule:
    """ddpfleet doctor filter: the table."""

    def filters(self) -> dict:
        return {"ddpfleet_doctor_table": table}
