"""Filters of the doctor role (controller side, pure Python): the report, with its flags
(what runs below ``ratio`` of the median, with the likely cause in words). A container's output
is read by ddpfleet_doctor_output.py, the table printed by ddpfleet_doctor_table.py (each plugin
file stands alone: Ansible loads them one by one)."""

from __future__ import annotations

import statistics

RATIO = 0.8


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


class FilterModule:
    """ddpfleet doctor filter: the report."""

    def filters(self) -> dict:
        return {"ddpfleet_doctor_report": report}
