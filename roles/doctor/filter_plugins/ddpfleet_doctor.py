"""Filters of the doctor role (controller side, pure Python): the JSON line of a doctor
container's output, the line naming the cause of a failed one, the report with its flags
(what runs below ``ratio`` of the median, with the likely cause in words) and the table
doctor.yml prints."""

from __future__ import annotations

import json
import re
import statistics

RATIO = 0.8


def result(output: object) -> dict:
    """The last line of a container's output that is a JSON object ({} when there is none)."""
    for raw in reversed(str(output or "").splitlines()):
        line = raw.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


# trainer.doctor's own one line ("doctor network: ..."), behind torchrun's "[rank0]:" if any.
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s*")
_DOCTOR_LINE = re.compile(r"^doctor (?:compute|storage|network): ")
# The last line of a Python traceback ("MemoryError: ..."); torchrun's own is no cause.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?")
_LAUNCHER = "ChildFailedError"
# torchrun's box when a rank died without a word (a signal, the OOM killer): its exit code.
_EXITCODE_LINE = re.compile(r"^exitcode\s*:")


def error(output: object, status: object = None) -> str:
    """The line of a failed container's output that names the cause: trainer.doctor's one
    line, else the last exception of a traceback, else torchrun's exit code of the rank,
    else the last line with words in it (not a separator such as torchrun's '=====')."""
    lines = [_RANK_PREFIX.sub("", raw).strip() for raw in str(output or "").splitlines()]
    lines = [line for line in lines if line]
    for wanted in (
        _DOCTOR_LINE.match,
        lambda line: _EXCEPTION_LINE.match(line) and _LAUNCHER not in line,
        _EXITCODE_LINE.match,
        lambda line: re.search(r"\w", line),
    ):
        found = [line for line in lines if wanted(line)]
        if found:
            return " ".join(found[-1].split())
    return f"the container printed nothing to name (status {status})"


def below_median(values: dict[str, float], ratio: float = RATIO) -> list[dict]:
    """{subject, value, median, ratio} for each value below ``ratio`` x the median (two values
    at least; nothing is flagged against a median of zero)."""
    if len(values) < 2:
        return []
    mid = statistics.median(values.values())
    if mid <= 0:
        return []
    return [
        {"subject": k, "value": round(v, 3), "median": round(mid, 3), "ratio": round(v / mid, 2)}
        for k, v in values.items()
        if v < ratio * mid
    ]


def _quota(host: str, cpus: dict) -> str:
    return f"the CPU quota (train_cpus: {cpus[host]:g} on this host)" if cpus.get(host) else ""


def _gpu_text(health: list | None) -> list[str]:
    return [f"GPU {g.get('index')}: {p}" for g in health or [] for p in g.get("problems", [])]


def _compute_cause(
    flag: dict, host: str, compute: dict, cpus: dict, gpu: dict | None = None
) -> str:
    head = f"{flag['subject']} computes at {flag['ratio']:.2f} of the median"
    quota = _quota(host, cpus)
    if compute.get("device") == "cuda":
        health = [
            g
            for g in compute.get("gpu_health") or []
            if gpu is None or g.get("index") == gpu.get("gpu")
        ]
        seen = _gpu_text(health)
        if seen:
            causes = [*seen, quota]
        else:
            causes = [
                "clocks, ECC and PCIe width looked normal under load: a different GPU model, "
                "power limits, or other processes on the GPU",
                quota,
            ]
        return f"{head}: " + "; ".join(c for c in causes if c)
    cores = f"fewer cores ({compute.get('cpus_visible')} visible here)"
    first = f"{quota} or {cores}" if quota else f"a CPU quota or {cores}"
    return f"{head}: {first}, thermal/clock limits, or other load on the host"


def _pair_flags(pairs: list, cpus: dict, ratio: float) -> list[dict]:
    rates = {f"{p['a']}-{p['b']}": float(p["gbits_per_sec"]) for p in pairs}
    flags = below_median(rates, ratio)
    ends = {f"{p['a']}-{p['b']}": (p["a"], p["b"]) for p in pairs}
    common = (
        set.intersection(*(set(ends[f["subject"]]) for f in flags)) if len(flags) > 1 else set()
    )
    for f in flags:
        a, b = ends[f["subject"]]
        f["hosts"] = [a, b]
        extra = [
            f"{h} is in every slow link: look at its NIC, cable and switch port first"
            for h in sorted(common)
        ]
        extra += [
            f"{q} limits how fast {h} sends and receives" for h in (a, b) if (q := _quota(h, cpus))
        ]
        f["cause"] = (
            f"{f['subject']} carries {f['value']:g} Gbit/s, {f['ratio']:.2f} of the median link: "
            "an MTU mismatch, a slower NIC or a congested switch port"
            + "".join(f"; {x}" for x in extra)
        )
    return [{"kind": "link", **f} for f in flags]


def _host_link_flags(hosts: list, pairs: list, cpus: dict, ratio: float) -> list[dict]:
    """With 3 hosts or more: a host whose links (the median of its pairs) are slow. One slow
    host drags the median of the pairs down with it, so the pairs alone do not show it."""
    if len(hosts) < 3:
        return []
    own = {h: [float(p["gbits_per_sec"]) for p in pairs if h in (p["a"], p["b"])] for h in hosts}
    flags = below_median({h: statistics.median(v) for h, v in own.items() if v}, ratio)
    for f in flags:
        quota = _quota(f["subject"], cpus)
        f["hosts"] = [f["subject"]]
        f["cause"] = (
            f"{f['subject']}'s links run at {f['ratio']:.2f} of the median host's: "
            "its NIC, MTU, cable or switch port" + (f", or {quota}" if quota else "")
        )
    return [{"kind": "link", **f} for f in flags]


def flags(doc: dict, cpus: dict, ratio: float = RATIO) -> list[dict]:
    """Every host, GPU or link below ``ratio`` of its median, with the likely cause."""
    hosts = doc["hosts"]
    found = []
    rates = {h: float(v["compute"]["images_per_sec"]) for h, v in hosts.items() if v.get("compute")}
    for f in below_median(rates, ratio):
        cause = _compute_cause(f, f["subject"], hosts[f["subject"]]["compute"], cpus)
        found.append({"kind": "compute", **f, "hosts": [f["subject"]], "cause": cause})
    gpus = {
        f"{h} gpu{g['gpu']}": (h, g)
        for h, v in hosts.items()
        for g in (v.get("compute") or {}).get("per_gpu") or []
    }
    if len(gpus) > len(hosts):  # several GPUs somewhere: also compare the GPUs with each other
        for f in below_median({k: float(g["images_per_sec"]) for k, (_, g) in gpus.items()}, ratio):
            host, gpu = gpus[f["subject"]]
            cause = _compute_cause(f, host, hosts[host]["compute"], cpus, gpu)
            found.append({"kind": "compute", **f, "hosts": [host], "cause": cause})
    pairs = (doc.get("network") or {}).get("pairs") or []
    link_flags = _pair_flags(pairs, cpus, ratio) + _host_link_flags(list(hosts), pairs, cpus, ratio)
    slow_links = {h for f in link_flags for h in f["hosts"]}
    reads = {
        h: float(v["storage"]["read_mb_per_sec"]) for h, v in hosts.items() if v.get("storage")
    }
    for f in below_median(reads, ratio):
        quota = _quota(f["subject"], cpus)
        cause = (
            f"{f['subject']} reads the dataset at {f['ratio']:.2f} of the median: "
            "its NFS mount options (rsize, nconnect), its link to the storage server"
            + (" (its links are slow too)" if f["subject"] in slow_links else "")
            + (f", or {quota}" if quota else ", or other load on the host")
        )
        found.append({"kind": "storage", **f, "hosts": [f["subject"]], "cause": cause})
    return found + link_flags


def report(
    computes: dict,
    storages: dict | None,
    network: dict | None,
    time: str,
    *,
    cpus: dict | None = None,
    ratio: float = RATIO,
    requested: dict | None = None,
) -> dict:
    """The doctor's JSON document from each host's results and rank 0's network result.

    ``computes``: {host: compute JSON}; ``storages``: {host: storage JSON, {"skipped": why}
    or None}; ``cpus``: {host: train_cpus} (0: no quota); ``requested``: the model options as
    given (batch 0, amp auto), which train.yml's train_balance=auto matches its own against."""
    cpus = {h: float(c or 0) for h, c in (cpus or {}).items()}
    ratio = float(ratio)
    notes, out = [], {}
    for host, measured in computes.items():
        storage = (storages or {}).get(host) or None
        if storage and "skipped" in storage:
            notes.append(f"storage on {host}: skipped, {storage['skipped']}")
            storage = None
        compute = {"per_gpu": None, "gpu_health": None, **measured}
        out[host] = {"cpus": cpus.get(host, 0.0), "compute": compute, "storage": storage}
    first = next(iter(out.values()))["compute"] if out else {}
    devices = {v["compute"].get("device") for v in out.values()}
    doc = {
        "time": time,
        "model": {
            "arch": first.get("arch"),
            "image_size": first.get("image_size"),
            "batch_size": first.get("batch_size"),
            "amp": first.get("amp"),
            "device": devices.pop() if len(devices) == 1 else "mixed",
            "requested": requested or {},
        },
        "hosts": out,
        "network": network or {"allreduce": None, "pairs": []},
        "ratio": ratio,
        "notes": notes,
    }
    doc["flags"] = flags(doc, cpus, ratio)
    return doc


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
        ratio = doc.get("ratio", RATIO)
        lines.append(f"no flags: every host, GPU and link is at {ratio:g} of its median or better")
    if path:
        lines.append(f"JSON: {path}")
    return lines


class FilterModule:
    def filters(self) -> dict:
        return {
            "ddpfleet_doctor_result": result,
            "ddpfleet_doctor_error": error,
            "ddpfleet_doctor_report": report,
            "ddpfleet_doctor_table": table,
        }
