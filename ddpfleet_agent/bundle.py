"""The forensics bundle of a run the agents judged failed, taken before any rank is killed.

Every agent that sees the failure (its own judgement or the one claimed in the store) dumps its
living ranks (``forensics.collect``), queues their files for ``forensics/<attempt>/``, publishes
a compact record of them in the store (``dumped/<n>``) and waits until every host still heard
from has published one, so that no rank is dumped after a peer's ranks died. All of it ends
``timeout`` + 1 s after it began, whatever a host does. Node rank 0's agent then writes
index.json and the diagnosis line (``stacks.diagnose``) that summary.json carries.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from ddpfleet_agent import forensics
from ddpfleet_agent.peers import StoreLost

if TYPE_CHECKING:
    from ddpfleet_agent.supervise import Agent


def bundle_dir(run_dir: str, attempt: str) -> Path:
    return Path(run_dir) / "forensics" / (attempt or "attempt")


def take(agent: Agent, failure: dict) -> str | None:
    """Dump this host's ranks and wait for the peers'; returns node rank 0's diagnosis line."""
    cfg = agent.cfg
    if cfg.dump_timeout <= 0:
        return None
    deadline = time.time() + cfg.dump_timeout + 1.0
    out = bundle_dir(cfg.run_dir, agent.label)
    collected = forensics.collect(agent.ranks.rank_pids(), cfg.host, cfg.run_dir, cfg.dump_timeout)
    agent.records.submit(lambda: forensics.write_ranks(out, collected))
    agent.say(f"forensics: {len(collected['ranks'])} ranks dumped in {collected['seconds']} s")
    if not agent.store_ok:
        return None
    mine = forensics.compact(collected)
    dumps = {cfg.node_rank: mine}
    try:
        agent.peers.publish_dump(mine)
        while time.time() < deadline:
            agent.peers.exchange(agent._record("running"))  # keepalive: this host is not gone
            dumps.update(agent.peers.dumps())
            # a host judged gone was silent for peer_timeout already: no wait for it
            silent = agent.peers.silent(time.time(), min(5.0, cfg.peer_timeout))
            # nor for one whose ranks had all exited already: it has nothing to dump
            done = [n for n, v in agent.peers.views.items() if v.get("state") == "exited"]
            heard = set(agent.peers.members) - set(silent) - set(done)
            if heard <= set(dumps):
                break
            time.sleep(cfg.tick / 2)
    except StoreLost:
        agent.store_ok = False
    if not agent.peers.leads:
        return None
    missing = {
        cfg.hosts[n]: [r["rank"] for r in agent.peers.views.get(n, {}).get("ranks") or []]
        for n in agent.peers.members
        if n not in dumps
    }
    head = {"run_id": cfg.run_id, "attempt": agent.label, "reason": failure.get("reason"),
            "failure": failure}  # fmt: skip
    hosts = [dumps[n] for n in sorted(dumps)]
    line = forensics.diagnose_line(hosts, missing)
    agent.records.submit(lambda: forensics.write_index(out, head, hosts, missing))
    agent.say(f"forensics: {line}")
    return line
