"""Filters of the trainer_run role for unequal hosts: train_balance and train_cpus checks, the
doctor's throughput for this run's model, and the trainer's per-rank --batch-weights."""

from __future__ import annotations

import base64
import json
import math

from ansible.errors import AnsibleFilterError

OFF, AUTO = "off", "auto"


def _number(value: object) -> float | None:
    """A finite float, or None (bools, strings that are no number, nan, inf)."""
    if isinstance(value, bool):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def balance_mode(balance: object) -> str:
    """'off', 'auto' or 'map' (a {host: weight} mapping; YAML's bare off is False)."""
    if balance is False or (isinstance(balance, str) and balance.strip().lower() in ("off", "")):
        return OFF
    if isinstance(balance, str) and balance.strip().lower() == AUTO:
        return AUTO
    return "map"


def balance_problems(balance: object, hosts: list[str]) -> list[str]:
    """Why train_balance cannot be used with these trainers (empty: it can)."""
    mode = balance_mode(balance)
    if mode != "map":
        return []
    if not isinstance(balance, dict):
        what = "off, auto or a mapping of every trainer to a weight"
        return [f"train_balance must be {what} (got {balance!r})"]
    problems = []
    unknown = sorted(str(h) for h in balance if h not in hosts)
    if unknown:
        problems.append(f"train_balance names {', '.join(unknown)}, not in the trainers group")
    missing = [h for h in hosts if h not in balance]
    if missing:
        problems.append(
            f"train_balance gives no weight for {', '.join(missing)} (weigh every trainer)"
        )
    for host in hosts:
        if host in balance and ((w := _number(balance[host])) is None or w <= 0):
            got = balance[host]
            problems.append(
                f"train_balance weight of {host} must be a finite number > 0 (got {got!r})"
            )
    return problems


def cpus_problems(hostvars: object, hosts: list[str]) -> list[str]:
    """Each trainer's train_cpus (a Docker CPU quota for its run containers; 0: none) must be a
    finite number >= 0 (whether the host has that many CPUs, its preflight checks)."""
    problems = []
    for host in hosts:
        value = hostvars[host].get("train_cpus", 0)  # type: ignore[index]
        cpus = _number(value)
        if cpus is None or cpus < 0:
            problems.append(f"train_cpus of {host} must be a finite number >= 0 (got {value!r})")
    return problems


def _documents(slurped: list[dict]) -> list[dict]:
    """Doctor JSON documents from slurp results (``item``: the path; ``content``: base64),
    each with its ``path``; unreadable ones are left out."""
    docs = []
    for result in slurped:
        try:
            doc = json.loads(base64.b64decode(result.get("content", "")))
        except (ValueError, TypeError):
            continue
        if isinstance(doc, dict):
            docs.append(doc | {"path": str(result.get("item") or result.get("source") or "")})
    return docs


def doctor_speeds(slurped: list[dict], hosts: list[str], model: dict) -> dict:
    """{source, speeds: {host: img/s}} from the newest doctor result measured for this model
    on every trainer ({} when there is none). ``slurped``: slurp results of doctor JSON files;
    ``model``: arch, image_size, batch_size, amp as the run asks for them."""
    wanted = {k: str(model[k]) for k in ("arch", "image_size", "batch_size", "amp")}
    for record in sorted(_documents(slurped), key=lambda r: r["path"], reverse=True):
        model_doc = record.get("model") or {}
        measured = model_doc.get("requested") or model_doc  # as asked for (batch 0, amp auto)
        if any(str(measured.get(k)) != v for k, v in wanted.items()):
            continue
        found = record.get("hosts") or {}
        speeds = {
            h: _number(((found.get(h) or {}).get("compute") or {}).get("images_per_sec"))
            for h in hosts
        }
        if all(s is not None and s > 0 for s in speeds.values()):
            return {"source": record["path"], "speeds": speeds}
    return {}


def rank_weights(host_weights: dict, hosts: list[str], nproc: int) -> str:
    """The trainer's --batch-weights: one weight per global rank (node rank x nproc + local
    rank), each host's weight shared by its processes. '' when all are equal (no weighting)."""
    weights = []
    for host in hosts:
        weight = _number(host_weights.get(host))
        if weight is None or weight <= 0:
            raise AnsibleFilterError(f"no usable weight for {host}: {host_weights.get(host)!r}")
        weights.extend([weight / int(nproc)] * int(nproc))
    if max(weights) - min(weights) <= 1e-9 * max(weights):
        return ""
    top = max(weights)
    return ",".join(f"{w / top:.4g}" for w in weights)


class FilterModule:
    """ddpfleet trainer_run filters for unequal hosts."""

    def filters(self) -> dict:
        return {
            "ddpfleet_balance_mode": balance_mode,
            "ddpfleet_balance_problems": balance_problems,
            "ddpfleet_cpus_problems": cpus_problems,
            "ddpfleet_doctor_speeds": doctor_speeds,
            "ddpfleet_rank_weights": rank_weights,
        }
