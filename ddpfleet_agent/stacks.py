"""Where a rank was, from its stacks, and the run's diagnosis from every rank's.

``where`` reduces py-spy's JSON to what the main thread was doing: the collective it waited in
(``backward`` too: DDP all-reduces the gradients there), a data-loader wait, or its innermost
function; and the program's own innermost frame. ``diagnose`` groups the ranks by that and
names the odd one out (a rank outside the collective the others wait in, or a stopped rank)
and the hosts that gave no stacks.
"""

from __future__ import annotations

from collections import Counter

# torch.distributed's blocking calls: a rank inside one waits for its peers.
COLLECTIVES = frozenset(
    {
        "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
        "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
        "monitored_barrier", "recv", "reduce", "reduce_scatter", "reduce_scatter_tensor",
        "scatter", "send", "wait",
    }
)  # fmt: skip
# Frames of these are the library's, not the program's: a location names the program's frame.
LIBRARY_PARTS = ("torch/", "torchvision/", "numpy/", "PIL/", "threading.py", "runpy.py")


def _name(frame: dict) -> str:
    return str(frame.get("name") or "?").rsplit(".", 1)[-1]


def _short(frame: dict) -> str:
    return f"{frame.get('short_filename') or frame.get('filename')}:{frame.get('line')}"


def where(threads: list[dict], state: str = "") -> dict:
    """{"what": ..., "at": ..., "io": bool} of one rank's stacks (py-spy JSON); ``state`` is
    its process state letter (T: stopped, D: in uninterruptible I/O)."""
    # the thread whose stack says what the rank does: the main thread, else the first one
    main = [t for t in threads if t.get("thread_name") == "MainThread"] or threads or [{}]
    frames = [f for f in main[0].get("frames") or [] if str(f.get("filename")).endswith(".py")]
    what = _name(frames[0]) if frames else "no Python frame"
    for frame in frames:  # innermost first: the first recognised call is the one it waits in
        path, name = str(frame.get("filename") or ""), _name(frame)
        if "torch/distributed/" in path and name in COLLECTIVES:
            what = name
            break
        if "torch/autograd/" in path and "backward" in name:
            what = "backward"
            break
        if "torch/utils/data/" in path and name in ("__next__", "_next_data", "_get_data"):
            what = "DataLoader.__next__"
            break
    own = [f for f in frames if not any(p in str(f.get("filename")) for p in LIBRARY_PARTS)]
    at = _short(own[0]) if own else (_short(frames[0]) if frames else "")
    said = {"T": "stopped", "D": "uninterruptible I/O"}.get(state)
    what = f"{said} (process state {state}) in {what}" if said else what
    return {"what": what, "at": at, "io": state == "D" or what == "DataLoader.__next__"}


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(str(r) for r in sorted(ranks))


def diagnose(ranks: list[dict], missing: dict[str, list[int]] | None = None) -> str:
    """One line from every dumped rank's record ({"rank", "host", "where" | "error"}) and the
    hosts that gave no stacks (host -> its ranks, where known), e.g. "ranks 0,1 wait in
    all_reduce (engine.py:142); rank 2 (node3) in slow_step (hook.py:6): the odd one out"."""
    groups: dict[str, list[dict]] = {}
    for rec in ranks:
        if rec.get("where"):
            groups.setdefault(rec["where"]["what"], []).append(rec)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), min(r["rank"] for r in kv[1])))
    odd = _odd_one_out(ordered, bool(missing))
    parts = []
    for what, recs in ordered:
        at = Counter(r["where"]["at"] for r in recs).most_common(1)[0][0]
        who = _ranks([r["rank"] for r in recs])
        if what == odd:
            who += " (" + ",".join(sorted({str(r["host"]) for r in recs})) + ")"
        verb = "wait in" if _waits(what) else ("is" if what.startswith("stopped") else "in")
        parts.append(f"{who} {verb} {what}" + (f" ({at})" if at else "") +
                     (": the odd one out" if what == odd else ""))  # fmt: skip
    for rec in ranks:
        if not rec.get("where"):
            parts.append(f"rank {rec['rank']} ({rec.get('host')}): no stacks ({rec.get('error')})")
    for host, host_ranks in sorted((missing or {}).items()):
        who = _ranks(host_ranks) + " of " if host_ranks else ""
        parts.append(f"{who}{host}: no stacks (its agent did not answer)")
    return "; ".join(parts) if parts else "no stacks were collected"


def _waits(what: str) -> bool:
    return what in COLLECTIVES or what == "backward"


def _odd_one_out(ordered: list[tuple[str, list[dict]]], hosts_missing: bool) -> str | None:
    """The group that differs: a stopped rank's; else, while the others wait in collectives,
    the one group that does not; else the one smallest group. None when a host gave no stacks
    (it is then the likelier cause) or nothing stands out."""
    for what, _ in ordered:
        if what.startswith("stopped"):
            return what
    if len(ordered) < 2 or hosts_missing:
        return None
    outside = [what for what, _ in ordered if not _waits(what)]
    if len(outside) == 1 and len(outside) < len(ordered):
        return outside[0]
    sizes = sorted(len(recs) for _, recs in ordered)
    smallest = [what for what, recs in ordered if len(recs) == sizes[0]]
    return smallest[0] if len(smallest) == 1 and sizes[0] < sizes[-1] else None
