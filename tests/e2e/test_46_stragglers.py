"""A host that becomes slow during a run (train_rebalance=auto), caused for real in the sandbox:
node3's run container gets a CPU quota mid-run (``docker update --cpus``), as another job on
the host would take its CPUs. Node rank 0's agent finds it from the ranks' own time per image
and restarts the ranks at the next checkpoint with node3's share smaller; the quota lifted, the
same rule gives the share back at a later checkpoint. Neither counts as a restart, the global
batch stays the same, and the run goes on until stop.yml ends it.

Before the quota, the same run trains for SPARE intervals unloaded: no rebalance there is the
false-alarm check (the other e2e modules run with train_rebalance=off: the sandbox's three
nodes share 2 cores, and their own assertions count the starts of their runs).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from site_fixtures import run_site
from test_30_train import containers, run_id, summary, train, wait_for
from test_35_faults import SPARE_STEPS, wait_attempts, wait_gone

# steps per log interval, the detector's unit (the median of 5 is its figure): each interval
# of a start costs steps, most of them node3's slowed ones (at 5: 5.5 min of CI, 2.3 of them
# from the quota to the first step with new shares)
LOG_EVERY = 4
QUIET = 6  # intervals trained unloaded before the quota: none may rebalance
# Three single-threaded ranks on the sandbox's 2 cores run at the speed of where the scheduler
# put them (alone on a core: 2.3x the two sharing the other, as a first try measured, and
# rebalanced for): every node's run container gets the same quota, under half a core, so equal
# hosts are equal wherever they run. node3's is then cut to a quarter of it.
EQUAL_CPUS, SLOW_CPUS = 0.4, 0.1
# The quota is then lifted to a whole core: node3 fast again beyond doubt. Put back to
# EQUAL_CPUS, node3 at its small share (4-6 images a step) measured a time per image too far
# over the others' to pass the threshold in 2 of 4 runs (Xeon, 2026-12-02): a step's fixed
# costs weigh more on a small share (docs/training.md says so of the detector).
LIFTED_CPUS = 1.0


def quota(cluster: Any, node: Any, rid: str, cpus: str) -> None:
    done = cluster.ssh(node, f"docker update --cpus {cpus} ddpfleet-{rid}-{node.name}")
    assert done.returncode == 0, done.stderr


def host_shares(attempt: dict) -> dict[str, int]:
    return dict(zip(attempt["hosts"], attempt["shares"], strict=True))


@pytest.fixture(scope="module")
def slowed(cluster: Any, tmp_path_factory: pytest.TempPathFactory) -> dict:
    rid, slow = run_id("straggler"), cluster.nodes[2]
    equal = tmp_path_factory.mktemp("stragglers") / "equal.yml"
    hosts = "".join(f"    {n.name}:\n      train_cpus: {EQUAL_CPUS}\n" for n in cluster.nodes)
    equal.write_text(f"all:\n  hosts:\n{hosts}")
    run = train(cluster, rid, "-i", str(equal), "-e", "train_follow=false",
                "-e", "train_rebalance=auto",
                "-e", f"train_max_steps={SPARE_STEPS}", "-e", f"train_log_every={LOG_EVERY}",
                "-e", f"train_checkpoint_every={LOG_EVERY}", "-e", "train_image_size=64",
                "-e", "train_batch_size=16", "-e", "train_synthetic=true")  # fmt: skip
    assert run.rc == 0, run.tail()
    first = wait_for(cluster, rid, None, step=3)["step"]
    quiet = wait_for(cluster, rid, None, step=first + QUIET * LOG_EVERY)
    quota(cluster, slow, rid, str(SLOW_CPUS))
    slowed_at = time.time()
    attempts = wait_attempts(cluster, rid, 2, timeout=240)
    found = time.time() - slowed_at
    print(f"\nnode3 at {SLOW_CPUS} CPU -> first step with new shares: {found:.1f} s")
    quota(cluster, slow, rid, str(LIFTED_CPUS))
    lifted_at = time.time()
    attempts = wait_attempts(cluster, rid, 3, timeout=240)
    back = time.time() - lifted_at
    print(f"quota lifted -> first step with the share given back: {back:.1f} s")
    status = run_site(cluster, "-e", f"run_id={rid}", playbook="status.yml")
    stop = run_site(cluster, "-e", f"run_id={rid}", playbook="stop.yml")
    assert stop.rc == 0, stop.tail()
    wait_gone(cluster, rid, 60)
    data = summary(cluster, rid)
    print(f"each start's shares: {[a.get('shares') for a in data['attempts']]}")
    return {"rid": rid, "quiet": quiet, "data": data, "status": status, "found": found,
            "back": back, "attempts": attempts}  # fmt: skip


def test_an_unloaded_run_is_not_rebalanced(slowed: dict) -> None:
    """QUIET intervals of three equal hosts sharing the sandbox's cores: no false alarm."""
    assert len(slowed["quiet"].get("attempts") or []) == 1, slowed["quiet"]["attempts"]


def test_a_slowed_host_gets_a_smaller_share_at_a_checkpoint(cluster: Any, slowed: dict) -> None:
    first, smaller, *_ = slowed["data"]["attempts"]
    assert smaller["cause"].startswith("rebalanced: "), smaller
    assert "node3 " in smaller["cause"]
    before, after = host_shares(first), host_shares(smaller)
    assert after["node3"] < before["node3"], (before, after)
    assert after["node1"] > before["node1"], (before, after)
    assert smaller["speeds"]["node3"] < 0.7, smaller["speeds"]
    assert smaller["from_step"] % LOG_EVERY == 0  # a checkpoint's step
    assert smaller["hosts"] == [n.name for n in cluster.nodes]


def test_the_share_comes_back_once_the_host_is_fast_again(slowed: dict) -> None:
    _, smaller, again = slowed["data"]["attempts"][:3]
    assert again["cause"].startswith("rebalanced: "), again
    assert host_shares(again)["node3"] > host_shares(smaller)["node3"], (smaller, again)
    assert again["from_step"] > smaller["from_step"]


def test_rebalancing_keeps_the_global_batch_and_counts_no_restart(slowed: dict) -> None:
    data = slowed["data"]
    assert data["status"] == "stopped", (data.get("cause"), data["attempts"])
    assert data["restarts"] == 0
    # the two rebalances, and none other but with new shares (the run goes on until stop.yml)
    assert len(data["attempts"]) >= 3, data["attempts"]
    assert all(a["cause"].startswith("rebalanced: ") for a in data["attempts"][1:])
    batches = {a["global_batch"] for a in data["attempts"]}
    assert batches == {data["global_batch"]} == {48}
    assert all(sum(a["shares"]) == 48 for a in data["attempts"])


def test_status_names_the_shares_the_run_goes_on_with(cluster: Any, slowed: dict) -> None:
    """status.yml while the run went on with the share given back: its progress line."""
    status, again = slowed["status"], slowed["data"]["attempts"][2]
    assert status.rc == 0, status.tail()
    assert f", {again['cause']})" in " ".join(status.stdout.split()), status.tail()
    assert containers(cluster, slowed["rid"]) == {}  # stop.yml ended it
