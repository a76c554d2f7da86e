"""A forensics bundle of a live run, taken from outside its agents (``-e dump=true``).

status.yml and stop.yml run ``python -m ddpfleet_agent dump --out DIR --host H`` in every run
container (its ranks into DIR, and ``host-<H>.json``), then ``... index --out DIR --hosts
h0,h1,..``: DIR/index.json from those, and the diagnosis line printed.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from ddpfleet_agent import forensics
from ddpfleet_agent.files import read_json, write_json_atomic


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ddpfleet_agent")
    p.add_argument("action", choices=["dump", "index"])
    p.add_argument("--out", required=True, help="the bundle's directory")
    p.add_argument("--host", default=os.uname().nodename)
    p.add_argument("--storage", default="", help="a path on the shared storage to stat")
    p.add_argument("--timeout", type=float, default=forensics.DUMP_TIMEOUT)
    p.add_argument("--run-id", default="")
    p.add_argument("--attempt", default="")
    p.add_argument("--hosts", default="", help="every host of the run, comma-separated")
    ns = p.parse_args(argv)
    out = Path(ns.out)
    os.umask(0o027)
    if ns.action == "dump":
        collected = forensics.collect(forensics.rank_pids(), ns.host, ns.storage, ns.timeout)
        forensics.write_ranks(out, collected)
        write_json_atomic(out / f"host-{ns.host}.json", forensics.compact(collected))
        print(f"{ns.host}: {len(collected['ranks'])} ranks dumped in {collected['seconds']} s")
        return 0
    hosts = [read_json(f) for f in sorted(out.glob("host-*.json"))]
    hosts = [h for h in hosts if h.get("host")]
    seen = {h["host"] for h in hosts}
    missing = {h: [] for h in ns.hosts.split(",") if h and h not in seen}
    head = {"run_id": ns.run_id, "attempt": ns.attempt, "reason": "dump requested"}
    print(forensics.write_index(out, head, hosts, missing))
    return 0
