"""The forensics bundle of a run the agents judged failed, taken before any rank is killed.

Every agent that sees the failure dumps its living ranks into ``forensics/<attempt>/``,
publishes a compact record of them in the store and waits until every host still heard from
has published one, so that no rank is dumped after a peer's ranks died: ``timeout`` + 1 s at
most, whatever a host does. Node rank 0's agent then writes index.json and the diagnosis line
that summary.json carries.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from ddpfleet_agent import forensics
from ddpfleet_agent.cli import AgentConfig
from ddpfleet_agent.peers import Peers, StoreLost
from ddpfleet_agent.ranks import LocalRanks
from ddpfleet_agent.records import Records


def take(cfg: AgentConfig, peers: Peers, ranks: LocalRanks, records: Records, failure: dict, *,
         say: Callable[[str], None], label: str,
         store_ok: bool) -> tuple[str | None, bool]:  # fmt: skip
    """Dump this host's ranks, wait for the peers'; returns (node rank 0's diagnosis, store_ok)."""
    if cfg.dump_timeout <= 0:
        return None, store_ok
    deadline = time.time() + cfg.dump_timeout + 1.0
    out = Path(cfg.run_dir) / "forensics" / (label or "attempt")
    collected = forensics.collect(ranks.rank_pids(), cfg.host, cfg.run_dir, cfg.dump_timeout)
    records.submit(lambda: forensics.write_ranks(out, collected))
    say(f"forensics: {len(collected['ranks'])} ranks dumped in {collected['seconds']} s")
    if not store_ok:
        return None, store_ok
    dumps = {cfg.node_rank: forensics.compact(collected)}
    try:
        peers.publish_dump(dumps[cfg.node_rank])
        while time.time() < deadline:
            peers.exchange(ranks.record("running"))  # keepalive: this host is not gone
            dumps.update(peers.dumps())
            # a host judged gone was silent for peer_timeout already: no wait for it
            silent = peers.silent(time.time(), min(5.0, cfg.peer_timeout))
            # nor for one whose ranks had all exited already: it has nothing to dump
            done = [n for n, v in peers.views.items() if v.get("state") == "exited"]
            if set(peers.members) - set(silent) - set(done) <= set(dumps):
                break
            time.sleep(cfg.tick / 2)
    except StoreLost:
        store_ok = False
    if not peers.leads:
        return None, store_ok
    missing = {
        cfg.hosts[n]: [r["rank"] for r in peers.views.get(n, {}).get("ranks") or []]
        for n in peers.members
        if n not in dumps
    }
    head = {"run_id": cfg.run_id, "attempt": label, "reason": failure.get("reason"),
            "failure": failure}  # fmt: skip
    hosts = [dumps[n] for n in sorted(dumps)]
    line = forensics.diagnose_line(hosts, missing)
    records.submit(lambda: forensics.write_index(out, head, hosts, missing))
    say(f"forensics: {line}")
    return line, store_ok
