"""Two train.yml with one run_id, started 0.5 s apart: the run is launched exactly once (the
launch lock on the shared storage); the second waits for the lock, finds the run running and
follows it to the same end. Neither disturbs the other's containers or records."""

from __future__ import annotations

import time
from typing import Any

from test_30_train import run_file, run_id, start_train, summary
from train_fixtures import SHARED


def test_two_train_yml_at_once_launch_the_run_once(cluster: Any) -> None:
    rid = run_id("twice")
    args = ("-e", "train_synthetic=true", "-e", "train_max_steps=6")
    first = start_train(cluster, rid, *args)
    time.sleep(0.5)
    second = start_train(cluster, rid, *args)
    out_first, _ = first.communicate(timeout=600)
    out_second, _ = second.communicate(timeout=600)
    assert first.returncode == 0, out_first[-3000:]
    assert second.returncode == 0, out_second[-3000:]
    launches = run_file(cluster, rid, "nodes/node1.log").count("node1: node_rank 0 of 3, attempt")
    assert launches == 1, run_file(cluster, rid, "nodes/node1.log")
    data = summary(cluster, rid)
    assert (data["status"], data["steps"]) == ("completed", 6)
    assert sum(f"run {rid} completed" in out for out in (out_first, out_second)) == 2
    gone = cluster.ssh(cluster.nodes[0], f"test ! -e {SHARED}/runs/{rid}.lock")
    assert gone.returncode == 0, "the launch lock was left behind"
