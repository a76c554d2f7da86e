"""How unequal hosts share a run's global batch, worked out on the controller before a launch:
train_balance's mode, the newest doctor figures for the run's model, and the trainer's per-rank
``--batch-weights``. Standard library only (train.yml's filters import it); trainer.balance
splits the batch by these weights inside the run.
"""

from __future__ import annotations

import base64
import json

from trainer.options import finite as _number


def balance_mode(balance: object) -> str:
    """train_balance: 'off', 'auto' or 'map' (a {host: weight} mapping; YAML's bare off is
    False)."""
    if balance is False or (isinstance(balance, str) and balance.strip().lower() in ("off", "")):
        return "off"
    if isinstance(balance, str) and balance.strip().lower() == "auto":
        return "auto"
    return "map"


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
            raise ValueError(f"no usable weight for {host}: {host_weights.get(host)!r}")
        weights.extend([weight / int(nproc)] * int(nproc))
    if max(weights) - min(weights) <= 1e-9 * max(weights):
        return ""
    top = max(weights)
    return ",".join(f"{w / top:.4g}" for w in weights)
