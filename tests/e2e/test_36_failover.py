"""Node rank 0's host lost, caused for real in the sandbox (ddpfleet_agent/failover.py).

- node2 is node rank 0 (train_master_host=node2: it serves neither the NFS export nor the
  registry, which are node1's). While the run trains, a client on node1 without the run's
  secret throws malformed frames and values at the agents' store on node2; the run goes on.
  Then node2 is cut off from its peers (DROP rules in its own netfilter tables, as in
  test_35): node1 serves a new store, node1 and node3 restart without node2 from the newest
  checkpoint with the same global batch, status.yml finds the run from another host while
  node2's storage does not answer, and node2, reconnected, rejoins at a checkpoint; the run
  goes on with every host. Then node3 goes off the network (every packet but its loopback's
  dropped: the controller cannot reach it either); the run goes on without it, and stop.yml,
  while node3 still cannot be reached, stops it on node1 and node2 (rc 0, summary
  `stopped`); back on the network, node3's agent ends and the run stays stopped.
- Where too few hosts are left (train_min_hosts=3), losing node rank 0's host (its container
  killed) fails the run within the peer timeout + 60 s, naming the host, and no container of
  the run is left.
- Node rank 0's run container paused (docker pause: agent and ranks frozen, as in a paused
  VM) past the peer timeout, train_min_hosts=1: node1 serves the store and node1 and node3 go
  on; node2, unpaused, steps down at once and is taken back at a checkpoint. Then the store's
  host (node1) and the next in node rank order (node2) are killed at once: node3 waits for
  node2's store, finds node2 refusing the store's port, serves the store itself and trains on
  alone with the same global batch, until stop.yml.
- A run train.yml follows loses node rank 0's host for good: node2 drops every packet but its
  loopback's (gone for its peers and for the controller alike). train.yml's reads through
  node2 fail, it reads through node1 from then on, the run completes on node1 and node3, and
  train.yml reports it completed (rc 0) with the restart that left node2 out and the plot;
  status.yml, stop.yml and train.yml again, while node2 cannot be reached, read the run through
  the others (status.yml names node2 unreachable); back on the network, node2's agent ends.
Cost: four runs, ~6 min on a 2-core host.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from site_fixtures import figure, run_site, task_started
from test_30_train import run_file, run_id, start_train, started, summary, wait_for
from test_35_faults import (
    PEER_TIMEOUT,
    SPARE_STEPS,
    drop_peers,
    launch,
    wait_attempts,
    wait_gone,
)
from time_bounds import within
from train_fixtures import SHARED

# A store client without the run's secret, from another node: frames that are no JSON, one
# whose length lies, a JSON nest deeper than the parser's recursion limit, unsigned values under
# the agents' keys, keys no agent writes, idle connections. Every answer is ignored.
HOSTILE = r"""
import base64, json, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
def conn():
    return socket.create_connection((host, port), timeout=5)
def frame(s, body):
    s.sendall(len(body).to_bytes(4, "big") + body)
def ask(req):
    try:
        with conn() as s:
            frame(s, json.dumps(req).encode())
            s.settimeout(5)
            s.recv(65536)
    except OSError:
        pass
deep = base64.b64encode(b"[" * 200000).decode()
for key in ("stop", "failure", "alive/1", "ranks/2", "join/1", "exit/0", "leader", "junk/9"):
    ask({"op": "set", "key": key, "value": deep})
    forged = base64.b64encode(b'{"v": {"by": "x"}, "mac": "0"}').decode()
    ask({"op": "set", "key": key, "value": forged})
for body in (b"not json", b"[1, 2]", b'{"op": "compare_set", "key": "stop"}'):
    try:
        with conn() as s:
            frame(s, body)
    except OSError:
        pass
idle = []
for _ in range(50):
    try:
        s = conn()
        s.sendall((4 << 20).to_bytes(4, "big") + b"{")  # a 4 MiB frame begun, never finished
        idle.append(s)
    except OSError:
        break
time.sleep(3)
print(f"hostile: {len(idle)} half-sent frames held")
"""


# When SSH itself gives up on a host off the network: ServerAliveInterval 15 s (ansible.cfg)
# times ServerAliveCountMax 3
KEEPALIVES = 45


def off_network(node: Any, action: str) -> None:
    """Insert (-I) or delete (-D) rules that drop every packet of the node but its loopback's,
    through the engine (docker exec): with them in, nothing reaches it, not the test's SSH."""
    for chain, way in (("INPUT", "-i"), ("OUTPUT", "-o")):
        rule = ["iptables", action, chain, "!", way, "lo", "-j", "DROP"]
        done = subprocess.run(["docker", "exec", node.hostname, *rule],
                              capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def leader_lost(cluster: Any) -> dict:
    rid = run_id("leader")
    store_node, victim, third = cluster.nodes  # node1 (NFS, registry), node2, node3
    launch(cluster, rid, "-e", f"train_master_host={victim.name}",
           "-e", f"train_peer_timeout={PEER_TIMEOUT}", "-e", "train_min_hosts=2",
           "-e", "train_restarts=2", "-e", f"train_max_steps={SPARE_STEPS}",
           "-e", "train_checkpoint_every=5", "-e", "train_image_size=128")  # fmt: skip
    host, port = json.loads(run_file(cluster, rid, "config.json"))["agent_store"].rsplit(":", 1)
    script = base64.b64encode(HOSTILE.encode()).decode()
    hostile = cluster.ssh(store_node, f"echo {script} | base64 -d | python3 - {host} {port}", 60)
    wait_for(cluster, rid, None, step=6)
    drop_peers(cluster, victim, "-I")
    cut_at = time.time()
    try:
        attempts = wait_attempts(cluster, rid, 2, timeout=PEER_TIMEOUT + 30 + 60)
        went_on = time.time() - cut_at
        figure(f"node rank 0's host cut off -> the run trained on without it: {went_on:.1f} s")
        status = run_site(cluster, "-e", f"run_id={rid}", playbook="status.yml")
    finally:
        drop_peers(cluster, victim, "-D")
    back = wait_attempts(cluster, rid, 3, timeout=180)[2]
    figure(f"node rank 0's host back -> first step with it: {back['heal_sec']} s")
    # as test_35's: the run has steps to spare. With every host back, node3 goes off the
    # network (gone for its peers and the controller alike); once the run trains on without
    # it, stop.yml ends it on the others while node3 still cannot be reached
    off_network(third, "-I")
    try:
        without = wait_attempts(cluster, rid, 4, timeout=PEER_TIMEOUT + 30 + 60)[3]
        stop = run_site(cluster, "-e", f"run_id={rid}", playbook="stop.yml")
    finally:
        off_network(third, "-D")
    figure(f"a running run, node3 off the network -> stop.yml {stop.wall_s} s")
    took = wait_gone(cluster, rid, 60)
    figure(f"node3 back on the network after the stop -> its agent gone: {took:.1f} s")
    data = summary(cluster, rid)
    return {"rid": rid, "victim": victim, "went_on": went_on, "status": status,
            "hostile": hostile, "summary": data, "shrunk": attempts[1], "stop": stop,
            "without": without, "hosts": [n.name for n in cluster.nodes],
            "third": third}  # fmt: skip


def test_a_hostile_store_client_does_not_end_the_run(leader_lost: dict) -> None:
    assert leader_lost["hostile"].returncode == 0, leader_lost["hostile"].stderr
    data = leader_lost["summary"]  # ended by stop.yml, with nothing failed on the way
    assert (data["status"], data.get("failure"), data.get("cause")) == ("stopped", None, None)


def test_losing_node_rank_0_s_host_heals_within_peer_timeout_and_30_s(leader_lost: dict) -> None:
    assert leader_lost["went_on"] <= within(PEER_TIMEOUT + 30)
    shrunk, victim = leader_lost["shrunk"], leader_lost["victim"].name
    assert shrunk["cause"].startswith(
        f"run {leader_lost['rid']} failed: host {victim} rank 0: lost the connection to the "
        f"run's store on {victim}"
    ), shrunk
    assert victim not in shrunk["hosts"]
    assert shrunk["world_size"] == 2


def test_the_global_batch_stays_the_same_under_the_new_store_s_host(leader_lost: dict) -> None:
    first, shrunk = leader_lost["summary"]["attempts"][:2]
    assert first["global_batch"] == shrunk["global_batch"] == sum(shrunk["shares"])


def test_status_finds_the_run_while_node_rank_0_s_host_is_cut_off(leader_lost: dict) -> None:
    status = leader_lost["status"]
    assert status.rc == 0, status.tail()
    assert f"run {leader_lost['rid']}: running" in status.stdout, status.tail()


def test_node_rank_0_s_host_rejoins_and_the_run_goes_on_with_every_host(
    leader_lost: dict,
) -> None:
    data, victim = leader_lost["summary"], leader_lost["victim"].name
    assert data["status"] == "stopped", data.get("cause")
    assert data["attempts"][-1]["from_step"] < data["steps"] < SPARE_STEPS, data
    back = data["attempts"][2]
    assert back["cause"].startswith(f"{victim} back: rejoined at the checkpoint of step "), back
    assert sorted(back["hosts"]) == sorted(leader_lost["hosts"])
    assert back["world_size"] == 3


def test_stop_ends_a_running_run_on_the_hosts_it_reaches_and_the_one_off_it_follows(
    leader_lost: dict,
) -> None:
    """stop.yml with node3 off the network: rc 0, the others stop with a checkpoint, and node3's
    agent, back on the network, ends without writing over the run's end."""
    stop, rid, third = leader_lost["stop"], leader_lost["rid"], leader_lost["third"].name
    assert third not in leader_lost["without"]["hosts"], leader_lost["without"]
    assert stop.rc == 0, stop.tail()
    assert f"run {rid} stopped (" in stop.stdout, stop.tail()
    assert f"resume with train.yml -e run_id={rid}" in stop.stdout, stop.tail()
    data = leader_lost["summary"]
    assert (data["status"], data["world_size"]) == ("stopped", 2), data
    assert sorted(data["attempts"][-1]["hosts"]) == ["node1", "node2"], data["attempts"][-1]


@pytest.fixture(scope="module")
def leader_lost_for_good(cluster: Any) -> dict:
    rid = run_id("leaderfinal")
    victim = cluster.nodes[1]
    launch(cluster, rid, "-e", f"train_master_host={victim.name}",
           "-e", f"train_peer_timeout={PEER_TIMEOUT}", "-e", "train_min_hosts=3",
           "-e", "train_restarts=2")  # fmt: skip
    kill = cluster.ssh(victim, f"docker kill ddpfleet-{rid}-{victim.name}")
    assert kill.returncode == 0, kill.stderr
    took = wait_gone(cluster, rid, PEER_TIMEOUT + 60)
    figure(f"node rank 0's host lost, too few left -> every container gone: {took:.1f} s")
    return {"rid": rid, "victim": victim, "took": took, "summary": summary(cluster, rid)}


def test_losing_node_rank_0_s_host_with_too_few_left_ends_in_bounded_time_naming_it(
    leader_lost_for_good: dict,
) -> None:
    data, victim = leader_lost_for_good["summary"], leader_lost_for_good["victim"].name
    assert leader_lost_for_good["took"] <= within(PEER_TIMEOUT + 60)
    assert data["status"] == "failed", data
    assert data["cause"].startswith(
        f"run {leader_lost_for_good['rid']} failed: host {victim} rank 0: "
    ), data["cause"]
    assert data["cause"].endswith("not restarted: 2 host(s) left, train_min_hosts is 3"), data


def pause(cluster: Any, node: Any, rid: str, action: str) -> None:
    """docker pause (or unpause) the node's run container: agent and ranks frozen at once by
    the cgroup freezer, as in a paused VM; the node's network and SSH go on."""
    done = cluster.ssh(node, f"docker {action} ddpfleet-{rid}-{node.name}")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def paused_then_two_lost(cluster: Any) -> dict:
    rid = run_id("paused")
    first, victim = cluster.nodes[:2]  # node1 (node rank 1), node2 (node rank 0)
    launch(cluster, rid, "-e", f"train_master_host={victim.name}",
           "-e", f"train_peer_timeout={PEER_TIMEOUT}", "-e", "train_min_hosts=1",
           "-e", "train_restarts=2", "-e", "train_checkpoint_every=5",
           "-e", "train_image_size=128")  # fmt: skip
    wait_for(cluster, rid, None, step=6)
    # node rank 0's container paused past the peer timeout: node1 serves the store, node1 and
    # node3 go on; unpaused, node2 steps down at once and is taken back at a checkpoint
    pause(cluster, victim, rid, "pause")
    paused_at = time.time()
    try:
        wait_attempts(cluster, rid, 2, timeout=PEER_TIMEOUT + 30 + 60)
        went_on = time.time() - paused_at
    finally:
        pause(cluster, victim, rid, "unpause")
    woke_at = time.time()
    figure(f"node rank 0's container paused -> the others trained on: {went_on:.1f} s (paused "
           f"{woke_at - paused_at:.1f} s)")  # fmt: skip
    wait_attempts(cluster, rid, 3, timeout=120)
    figure(f"node rank 0's container running again -> first step with it: "
           f"{time.time() - woke_at:.1f} s")  # fmt: skip
    # then node1, the store's host now, and node2, next in node rank order, killed at once
    with ThreadPoolExecutor(2) as pool:  # both containers, agents and ranks with them
        asked = [pool.submit(cluster.ssh, node, f"docker kill ddpfleet-{rid}-{node.name}")
                 for node in (first, victim)]  # fmt: skip
        kills = [ask.result() for ask in asked]
    killed_at = time.time()
    assert [k.returncode for k in kills] == [0, 0], [k.stderr for k in kills]
    attempts = wait_attempts(cluster, rid, 4, timeout=2 * PEER_TIMEOUT + 15 + 30 + 60)
    alone = time.time() - killed_at
    figure(f"the store's host and the next host's containers killed at once -> node3 trained "
           f"on alone: {alone:.1f} s")  # fmt: skip
    stop = run_site(cluster, "-e", f"run_id={rid}", playbook="stop.yml")
    assert stop.rc == 0, stop.tail()
    wait_gone(cluster, rid, 60)
    logs = {n.name: run_file(cluster, rid, f"nodes/{n.name}.log") for n in cluster.nodes}
    woke = [x for x in logs[victim.name].splitlines() if "stops serving the store" in x]
    figure(f"node rank 0's host as it woke: {woke[:1]}")
    return {"rid": rid, "went_on": went_on, "alone": alone, "attempts": attempts,
            "summary": summary(cluster, rid), "logs": logs}  # fmt: skip


def test_node_rank_0_s_host_paused_steps_down_as_it_wakes_and_is_taken_back(
    paused_then_two_lost: dict,
) -> None:
    """A paused VM, as the others see it a host cut off: node1 serves the store within the peer
    timeout + 30 s. node2, running again, steps down at once (its ranks' silence over the pause
    is no frozen rank) and rejoins at a checkpoint."""
    data, rid = paused_then_two_lost, paused_then_two_lost["rid"]
    assert data["went_on"] <= within(PEER_TIMEOUT + 30)
    shrunk, back = data["attempts"][1:3]
    assert sorted(shrunk["hosts"]) == ["node1", "node3"], shrunk
    assert shrunk["cause"].startswith(
        f"run {rid} failed: host node2 rank 0: lost the connection to the run's store on node2"
    ), shrunk
    log = data["logs"]["node2"]
    stepped_down = ("this host was paused for ", "lost contact with every other host")
    assert any(f"node2: {why}" in log for why in stepped_down), log[-3000:]
    assert "frozen" not in log, log[-3000:]
    assert back["cause"].startswith("node2 back: rejoined at the checkpoint of step "), back
    assert sorted(back["hosts"]) == ["node1", "node2", "node3"], back


def test_two_hosts_lost_at_once_the_third_serves_the_store_and_trains_on_alone(
    paused_then_two_lost: dict,
) -> None:
    """The store's host (node1) and the next in node rank order (node2) killed at once,
    train_min_hosts=1: node3 waits for node2's store (peer timeout + 15 s), finds node2
    refusing the store's port, serves the store itself and restarts alone."""
    data = paused_then_two_lost
    # the loss seen, the next host's store waited for, then node3's own restart
    assert data["alone"] <= within(PEER_TIMEOUT + (PEER_TIMEOUT + 15) + 30)
    passed_over = "node3: node2 does not serve the run's store (no store at "
    line = next((x for x in data["logs"]["node3"].splitlines() if passed_over in x), "")
    assert line.endswith(" and its host refuses the store's port: the run's store now on node3"), (
        data["logs"]["node3"][-3000:]
    )
    alone = data["attempts"][3]
    assert (alone["hosts"], alone["world_size"]) == (["node3"], 1), alone
    assert alone["cause"].startswith(f"run {data['rid']} failed: host node1 "), alone


def test_the_global_batch_stays_the_same_through_the_pause_and_the_double_loss(
    paused_then_two_lost: dict,
) -> None:
    data = paused_then_two_lost["summary"]
    assert (data["status"], len(data["attempts"]), data["restarts"]) == ("stopped", 4, 2), data
    batches = {a["global_batch"] for a in data["attempts"]}
    assert batches == {sum(data["attempts"][-1]["shares"])}, data["attempts"]


@pytest.fixture(scope="module")
def leader_gone_followed(cluster: Any) -> dict:
    rid = run_id("leadergone")
    victim = cluster.nodes[1]
    # 40 steps: the cut stalls the all-reduce, so however fast the CPU the run cannot end
    # before it heals; the rest of the run is then a few seconds on 2 hosts
    args = ["-e", f"train_master_host={victim.name}", "-e", f"train_peer_timeout={PEER_TIMEOUT}",
            "-e", "train_min_hosts=2", "-e", "train_restarts=2", "-e", "train_max_steps=40",
            "-e", "train_checkpoint_every=5", "-e", "train_image_size=128"]  # fmt: skip
    follow = start_train(cluster, rid, *args)
    since = time.monotonic()
    wait_for(cluster, rid, follow, step=6)
    off_network(victim, "-I")
    cut_at = time.time()
    try:
        run = started(follow, since)
        # node2 still off the network: status.yml, stop.yml and train.yml again (side by side:
        # each waits for SSH's connect timeout on node2 alone) read the run through the others
        with ThreadPoolExecutor(3) as pool:
            asked = [pool.submit(run_site, cluster, "-e", f"run_id={rid}", playbook=book)
                     for book in ("status.yml", "stop.yml", "train.yml")]  # fmt: skip
        status, stop, again = (ask.result() for ask in asked)
    finally:
        off_network(victim, "-D")
    figure(f"node rank 0's host off the network -> status.yml {status.wall_s} s, stop.yml "
           f"{stop.wall_s} s, train.yml again {again.wall_s} s (side by side)")  # fmt: skip
    moved = task_started(run.stdout, "Follow the run through node1")
    moved_after = None if moved is None else moved - cut_at
    if moved_after is not None:
        figure(f"node rank 0's host off the network -> train.yml reads through node1: "
               f"{moved_after:.1f} s")  # fmt: skip
    took = wait_gone(cluster, rid, PEER_TIMEOUT + 60)
    figure(f"node rank 0's host back on the network after the run ended -> its agent gone: "
           f"{took:.1f} s")  # fmt: skip
    return {"rid": rid, "victim": victim.name, "run": run, "summary": summary(cluster, rid),
            "status": status, "stop": stop, "again": again, "moved_after": moved_after}  # fmt: skip


def test_train_yml_follows_a_run_that_lost_node_rank_0_s_host_to_its_end(
    leader_gone_followed: dict,
) -> None:
    run, rid, victim = leader_gone_followed["run"], leader_gone_followed["rid"], "node2"
    assert run.rc == 0, run.tail()
    moved = f"run {rid}: its records cannot be read through {victim} ("
    assert moved in run.stdout, run.tail()
    # given up on well before SSH's keepalives would end it: the read left hanging on the host
    # off the network ("no answer within"), or, where the cut came between two reads, the next
    # one, which Ansible ends when sudo's answer does not come within its `timeout` + 2 s
    # ("Timeout (12s) waiting for privilege escalation prompt": 12.0 s after the cut once)
    moved_after = leader_gone_followed["moved_after"]
    assert moved_after is not None, run.tail()
    assert moved_after < KEEPALIVES - 5, (moved_after, run.tail())
    assert "TASK [trainer_run : Follow the run through node1]" in run.stdout
    after = run.stdout.split(moved, 1)[1]
    assert f"run {rid}: restarted on 2 hosts (without {victim}) (1)" in after, run.tail()
    assert f"run {rid} completed: " in after, run.tail()
    assert f"(on the controller; node1:{SHARED}/runs/{rid}/report.png)" in after, run.tail()


def test_a_run_completed_without_a_host_lost_for_good_is_reported_completed(
    leader_gone_followed: dict,
) -> None:
    data, run = leader_gone_followed["summary"], leader_gone_followed["run"]
    assert (data["status"], data["world_size"]) == ("completed", 2), data
    last = data["attempts"][-1]
    assert sorted(last["hosts"]) == ["node1", "node3"], last
    assert last["global_batch"] == data["attempts"][0]["global_batch"]
    # the run's wall time spans both starts; the trainer's own counts the last start alone
    assert data["wall_time_sec"] > data["last_start_wall_time_sec"], data
    assert f"wall time {data['wall_time_sec']:.1f}s" in run.stdout, run.tail()
    assert "status completed, steps 40, world size 2" in run.stdout, run.tail()
    assert "on 2 hosts: without node2) after: " in run.stdout, run.tail()


def test_status_and_stop_go_on_without_a_host_the_controller_cannot_reach(
    leader_gone_followed: dict,
) -> None:
    rid, status, stop = (leader_gone_followed[k] for k in ("rid", "status", "stop"))
    assert status.rc == 0, status.tail()
    for line in (f"run {rid}: completed", "node2: unreachable", "node3: container "):
        assert line in status.stdout, status.tail()
    assert stop.rc == 0, stop.tail()
    assert f"run {rid} is not running (status: completed); nothing to stop" in stop.stdout
    again = leader_gone_followed["again"]
    assert again.rc == 0, again.tail()
    assert f"run {rid} already completed; nothing to do" in again.stdout, again.tail()
