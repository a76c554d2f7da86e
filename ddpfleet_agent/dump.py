"""A forensics bundle of a live run, taken from outside its agents (``-e dump=true``).

``python -m ddpfleet_agent dump --out DIR --host H [--storage PATH]``, run in a run container
with docker exec, dumps the ranks there (``forensics.collect``) into DIR with
``host-<H>.json``; then ``python -m ddpfleet_agent index --out DIR --hosts h0,h1,..
--run-id R --attempt A`` writes DIR/index.json from those and prints the diagnosis line.
status.yml and stop.yml do both on every host of the run, then go on.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ddpfleet_agent.files import read_json, write_json_atomic
from ddpfleet_agent.forensics import (
    DUMP_TIMEOUT,
    collect,
    compact,
    rank_pids,
    write_index,
    write_ranks,
)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m ddpfleet_agent")
    p.add_argument("action", choices=["dump", "index"])
    p.add_argument("--out", required=True, help="the bundle's directory")
    p.add_argument("--host", default=os.uname().nodename)
    p.add_argument("--storage", default="", help="a path on the shared storage to stat")
    p.add_argument("--timeout", type=float, default=DUMP_TIMEOUT)
    p.add_argument("--run-id", default="")
    p.add_argument("--attempt", default="")
    p.add_argument("--hosts", default="", help="every host of the run, comma-separated")
    ns = p.parse_args(argv)
    out = Path(ns.out)
    os.umask(0o027)
    if ns.action == "dump":
        collected = collect(rank_pids(), ns.host, ns.storage, ns.timeout)
        write_ranks(out, collected)
        write_json_atomic(out / f"host-{ns.host}.json", compact(collected))
        print(f"{ns.host}: {len(collected['ranks'])} ranks dumped in {collected['seconds']} s")
        return 0
    hosts = [read_json(f) for f in sorted(out.glob("host-*.json"))]
    hosts = [h for h in hosts if h.get("host")]
    seen = {h["host"] for h in hosts}
    missing = {h: [] for h in ns.hosts.split(",") if h and h not in seen}
    head = {"run_id": ns.run_id, "attempt": ns.attempt, "reason": "dump requested"}
    print(write_index(out, head, hosts, missing))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
