"""Unequal hosts on the sandbox: the doctor finds the slowed host, train_balance=auto gives it
the smallest share of the global batch, and bad weights or a quota above a host's CPUs are
refused before anything starts.

One run does the doctor and the balanced run, as docs/operations.md shows it ("both in one go":
``train_doctor=true -e train_balance=auto``): doctor.yml is the same doctor role under a play of
its own, and a separate doctor.yml run checked the same path again (~100 s of CI).

node3 is made slow the way a user would: ``train_cpus`` (a Docker CPU quota on its run and
doctor containers) in an extra inventory file beside the sandbox's.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_30_train import containers, make_dataset, run_file, run_id, summary, train
from train_fixtures import SHARED, STAMP

# 0.3 of a core, against ~0.85 for each other host sharing the 2 cores: far below
# doctor_flag_ratio 0.8. The doctor's checks and the run all wait on node3: at 0.15 this module
# took 8 min on the EPYC without AVX512, at 0.3 (and the doctor twice) about 4 min.
SLOW, CPUS = "node3", 0.3
# the model both the doctor and the run use: small enough for 3 ranks on 2 cores
MODEL = {"arch": "resnet18", "image_size": 64, "batch_size": 16, "amp": "auto"}


@pytest.fixture(scope="module")
def slow_inventory(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    path = tmp_path_factory.mktemp("balance") / "slow.yml"
    path.write_text(f"all:\n  hosts:\n    {SLOW}:\n      train_cpus: {CPUS}\n")
    return ["-i", str(path)]


def model_vars(prefix: str) -> list[str]:
    return [a for k, v in MODEL.items() for a in ("-e", f"{prefix}_{k}={v}")]


@pytest.fixture(scope="module")
def balanced(cluster: Any, slow_inventory: list[str]) -> dict:
    """train_doctor=true checks every host first (compute, network, and storage on a JPEG data
    set), and train_balance=auto takes the figures of that report."""
    data = make_dataset(cluster, f"e2e-{STAMP}-doctor", "--classes 2 --train-per-class 40",
                        "--val-per-class 0 --size 160")  # fmt: skip
    before = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/doctor/ 2>/dev/null").stdout.split()
    rid = run_id("balance")
    run = train(
        cluster, rid, *slow_inventory, "-e", "train_synthetic=true", "-e", "train_balance=auto",
        "-e", "train_doctor=true", "-e", f"doctor_data_dir={SHARED}/datasets/{data}",
        "-e", "train_max_steps=6", "-e", "train_synthetic_size=480", *model_vars("train"),
    )  # fmt: skip
    assert run.rc == 0, run.tail()
    return {"rid": rid, "run": run, "before": before}


def newest_doctor_record(cluster: Any) -> dict:
    proc = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/doctor/ | sort | tail -n 1")
    assert proc.returncode == 0, proc.stderr
    name = proc.stdout.strip()
    text = cluster.ssh(cluster.nodes[0], f"cat {SHARED}/doctor/{name}").stdout
    return json.loads(text) | {"name": name}


def test_doctor_measures_every_host_and_flags_the_slow_one(cluster: Any, balanced: dict) -> None:
    record = newest_doctor_record(cluster)
    assert record["name"] not in balanced["before"]  # this run's own report
    doctor = balanced["run"]
    names = [n.name for n in cluster.nodes]
    assert sorted(record["hosts"]) == names
    speeds = {h: record["hosts"][h]["compute"]["images_per_sec"] for h in names}
    assert min(speeds, key=speeds.get) == SLOW, speeds
    # the hosts timed their steps over the same seconds, node3 warmed up last under its quota
    for host in names:
        assert record["hosts"][host]["compute"]["start_line"] == {
            "together": 3,
            "of": 3,
            "waited_sec": record["hosts"][host]["compute"]["start_line"]["waited_sec"],
        }
    waited = {h: record["hosts"][h]["compute"]["start_line"]["waited_sec"] for h in names}
    assert min(waited, key=waited.get) == SLOW, waited
    assert all(v > 0 for v in speeds.values()), speeds
    assert {(p["a"], p["b"]) for p in record["network"]["pairs"]} == {
        ("node1", "node2"),
        ("node1", "node3"),
        ("node2", "node3"),
    }
    assert record["network"]["allreduce"]["busbw_gbps"] > 0
    for host in names:  # every host read and decoded the data set's 80 JPEGs (or some of them)
        storage = record["hosts"][host]["storage"]
        assert storage["files"] > 0, storage
        assert storage["read_mb_per_sec"] > 0, storage
        assert storage["jpegs_per_sec"] > 0, storage
    flagged = [f for f in record["flags"] if f["kind"] == "compute"]
    assert [f["subject"] for f in flagged] == [SLOW], (speeds, record["flags"])
    assert "train_cpus" in flagged[0]["cause"]
    # the printed table: one row per host, and the flag in words
    for host in names:
        assert host in doctor.stdout
    assert flagged[0]["cause"] in doctor.stdout.replace("\\n", "\n")


def test_balanced_run_gives_the_slow_host_the_smallest_share(cluster: Any, balanced: dict) -> None:
    rid, run = balanced["rid"], balanced["run"]
    data = summary(cluster, rid)
    assert data["status"] == "completed"
    batches = data["per_rank_batch"]
    assert sum(batches) == data["global_batch"] == 3 * MODEL["batch_size"]
    assert batches[2] == min(batches), batches  # node3 is node rank 2
    assert batches[2] < batches[0], batches
    record = newest_doctor_record(cluster)
    assert f"FLAG compute {SLOW}: " in run.stdout  # its table, in train.yml's output
    config = json.loads(run_file(cluster, rid, "config.json"))
    assert config["balance"]["source"].endswith(record["name"])  # no calibration
    assert "--batch-weights" in config["trainer_args"]
    assert config["cpus"][SLOW] == CPUS
    # the quota as the doctor's check saw it from inside its container (in 10 ms periods:
    # ddpfleet_doctor_cpu_quota, the run container's ddpfleet_agent.container.cpu_limits)
    assert record["hosts"][SLOW]["compute"]["cpu_quota"] == CPUS, record["hosts"][SLOW]
    assert f"weights from {SHARED}/doctor/{record['name']}" in run.stdout
    assert len(set(data["param_sha256_per_rank"])) == 1  # the replicas stayed equal
    # the report: node3's row shows its share, and it is no straggler for it
    row = next(line for line in run.stdout.split("\\n") if f" {SLOW} " in line and "%)" in line)
    assert f"{batches[2]} (" in row, row
    assert "STRAGGLER" not in row, row


def test_bad_weights_are_refused_before_anything_starts(cluster: Any) -> None:
    rid = run_id("badweights")
    weights = json.dumps({"train_balance": {"node1": 2, "node2": 1, "node3": 0}})
    run = train(cluster, rid, "-e", "train_synthetic=true", "-e", weights)
    assert run.rc != 0
    assert "train_balance weight of node3 must be a finite number > 0 (got 0)" in run.stdout
    assert containers(cluster, rid) == {}
    listing = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/runs/").stdout.split()
    assert rid not in listing


def test_a_quota_above_the_hosts_cpus_is_refused_by_preflight(
    cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A quota above the host's CPUs would limit nothing (as ``--cpus`` dockerd refused it
    only when the container started): the preflight refuses it first, naming the host, and
    nothing is launched."""
    path = tmp_path_factory.mktemp("quota") / "quota.yml"
    path.write_text("all:\n  hosts:\n    node2:\n      train_cpus: 4096\n")
    rid = run_id("bigquota")
    run = train(cluster, rid, "-i", str(path), "-e", "train_synthetic=true")
    assert run.rc != 0
    assert "preflight failed on node2: train_cpus is 4096, more than the " in run.stdout
    assert containers(cluster, rid) == {}
    listing = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/runs/").stdout.split()
    assert rid not in listing
