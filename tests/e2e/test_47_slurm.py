"""Runs queued through Slurm on the sandbox (train.yml -e train_scheduler=slurm): the real
slurmctld, slurmd and munge that site.yml set up (the sandbox's inventory turns slurm_enabled on).

Two users, one cluster, in one go: run A is submitted (train_follow=false, a 30-minute time
limit) and trains; run B, submitted while A holds every host, waits in the queue as position 1
and does not touch A (run C, queued behind it, is taken back by stop.yml); ``scancel`` of A's
job stops A as stop.yml would (the ranks checkpoint, the run is recorded as stopped) and leaves
no container of it on any host; B then gets the hosts, and train.yml, run again for B, follows
it to completion with the records and report of a direct run. The job epilog removes a labelled
container a job's task left behind, and a partition that is unknown, or lacks a trainer, is
refused before anything is submitted.
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from site_fixtures import figure, run_site
from test_30_train import containers, gone_after, progress, run_file, summary, train, wait_for
from time_bounds import within
from train_fixtures import SHARED, STAMP, run_id

SLURM = ["-e", "train_scheduler=slurm", "-e", "train_synthetic=true"]
STOP_LIMIT_S = 60  # scancel to no container of the run: the ranks checkpoint and exit


def squeue(cluster: Any, *args: str) -> str:
    proc = cluster.ssh(cluster.nodes[0], "squeue --noheader " + " ".join(args))
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def slurm_names(cluster: Any) -> list[str]:
    """The trainers' Slurm node names (the etc_hosts role's names), in the nodes' order."""
    proc = cluster.ssh(cluster.nodes[0], "scontrol show hostnames $(sinfo --noheader -o %N)")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def job_of(out: str, rid: str) -> tuple[str, str]:
    """(job id, position text) of train.yml's "queued as job N (...)" line."""
    found = re.search(rf"run {re.escape(rid)} queued as job (\d+) \(([^)]*)\)", out)
    assert found, out[-3000:]
    return found.group(1), found.group(2)


def wait_job_ended(cluster: Any, job: str, timeout: float = 60) -> str:
    """The job's state once Slurm no longer has it running or completing."""
    deadline = time.monotonic() + within(timeout)
    while True:
        state = squeue(cluster, f"--jobs={job}", "--states=all", "--format=%T").strip()
        if state not in ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING"):
            return state
        assert time.monotonic() < deadline, f"Slurm job {job} still {state} after {timeout} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def queued(cluster: Any) -> dict:
    a, b, c = run_id("slurm-a"), run_id("slurm-b"), run_id("slurm-c")
    first = train(cluster, a, *SLURM, "-e", "train_follow=false", "-e", "train_time_limit=30",
                  "-e", "train_max_steps=400", "-e", "train_checkpoint_every=2")  # fmt: skip
    assert first.rc == 0, first.tail()
    job_a, _ = job_of(first.stdout, a)
    wait_for(cluster, a, None, step=2)
    limit = cluster.ssh(cluster.nodes[0], f"scontrol show job {job_a}").stdout
    second = train(cluster, b, *SLURM, "-e", "train_follow=false", "-e", "train_max_steps=6")
    assert second.rc == 0, second.tail()
    job_b, place = job_of(second.stdout, b)
    status = run_site(cluster, "-e", f"run_id={b}", playbook="status.yml")
    # a third run behind B, taken back by stop.yml while it waits
    third = train(cluster, c, *SLURM, "-e", "train_follow=false", "-e", "train_max_steps=6")
    assert third.rc == 0, third.tail()
    job_c, place_c = job_of(third.stdout, c)
    withdrawn = run_site(cluster, "-e", f"run_id={c}", playbook="stop.yml")
    a_step = progress(cluster, a).get("step", 0)
    pending = squeue(cluster, f"--jobs={job_b}", "--format=%T")
    # A goes on while B waits
    wait_for(cluster, a, None, step=a_step + 2)
    a_containers = containers(cluster, a)
    cancel = cluster.ssh(cluster.nodes[0], f"scancel {job_a}")
    assert cancel.returncode == 0, cancel.stderr
    stop_s = gone_after(cluster, a, time.monotonic(), STOP_LIMIT_S + 30)
    figure(f"scancel -> no container of the run on any host: {stop_s:.1f} s")
    # Slurm ends the job after its containers (the epilog runs first: COMPLETING); status.yml
    # says the state Slurm has, so ask it once Slurm has the job's end (a CI run asked within
    # that window and got COMPLETING)
    a_state = wait_job_ended(cluster, job_a)
    a_status = run_site(cluster, "-e", f"run_id={a}", playbook="status.yml")
    followed = train(cluster, b, "-e", "train_max_steps=6")  # attaches: B was launched
    return {
        "a": a, "b": b, "job_a": job_a, "job_b": job_b, "place": place, "limit": limit,
        "status": status, "pending": pending, "a_containers": a_containers, "stop_s": stop_s,
        "a_status": a_status, "a_state": a_state,
        "followed": followed, "c": c, "job_c": job_c, "place_c": place_c, "withdrawn": withdrawn,
    }  # fmt: skip


def test_a_run_through_slurm_completes_with_the_records_of_a_direct_run(
    cluster: Any, queued: dict
) -> None:
    run, b = queued["followed"], queued["b"]
    assert run.rc == 0, run.tail()
    assert f"run {b} is queued as Slurm job {queued['job_b']}" in run.stdout or (
        f"run {b} is running as Slurm job {queued['job_b']}" in run.stdout
    ), run.tail()
    assert f"run {b} completed" in run.stdout
    data = summary(cluster, b)
    assert (data["status"], data["steps"], data["world_size"]) == ("completed", 6, 3)
    for node in cluster.nodes:
        ended = json.loads(run_file(cluster, b, f"nodes/{node.name}.exit"))
        assert (ended["exit_code"], ended["outcome"]) == (0, "completed"), node.name
    assert (progress(cluster, b)["state"], progress(cluster, b)["status"]) == ("ended", "completed")
    assert "total" in run_file(cluster, b, "report.txt")
    config = json.loads(run_file(cluster, b, "config.json"))
    assert (config["scheduler"], config["slurm_job"]) == ("slurm", queued["job_b"])
    assert containers(cluster, b) == {}
    assert squeue(cluster, f"--name=ddpfleet-{b}") == ""  # the job ended with its run


def test_the_second_run_waited_in_the_queue_without_touching_the_first(queued: dict) -> None:
    assert queued["place"] == "position 1"
    assert queued["pending"].strip() == "PENDING"
    status = queued["status"]
    assert status.rc == 0, status.tail()
    line = f"run {queued['b']}: queued as Slurm job {queued['job_b']} (PENDING, position 1)"
    assert line in status.stdout, status.tail()
    # while B waited, A had a container on every host and went on training
    assert sorted(queued["a_containers"]) == ["node1", "node2", "node3"]


def test_stop_yml_cancels_a_queued_run_s_job(cluster: Any, queued: dict) -> None:
    assert queued["place_c"] == "position 2"
    stop = queued["withdrawn"]
    assert stop.rc == 0, stop.tail()
    assert f"run {queued['c']}: Slurm job {queued['job_c']} cancelled (PENDING)" in stop.stdout
    assert squeue(cluster, f"--jobs={queued['job_c']}", "--format=%T").strip() in ("", "CANCELLED")
    assert containers(cluster, queued["c"]) == {}
    assert "step" not in progress(cluster, queued["c"])  # it never started


def test_time_limit_is_the_job_s(queued: dict) -> None:
    assert "TimeLimit=00:30:00" in queued["limit"], queued["limit"]
    assert "OverSubscribe=NO" in queued["limit"]  # exclusive: the job holds its hosts whole


def test_scancel_stops_the_run_and_leaves_no_container(cluster: Any, queued: dict) -> None:
    a = queued["a"]
    assert containers(cluster, a) == {}
    assert queued["stop_s"] < within(STOP_LIMIT_S)
    assert summary(cluster, a)["status"] == "stopped"
    out = cluster.ssh(cluster.nodes[0], f"cat /var/lib/ddpfleet/runs/{a}/slurm-*.out").stdout
    assert f"SIGTERM from Slurm (job {queued['job_a']})" in out, out[-2000:]
    # the cause, in slurmstepd's words ("... DUE TO TIME LIMIT" at the time limit)
    assert re.search(rf"\*\*\* JOB {queued['job_a']} ON \S+ CANCELLED AT", out), out[-2000:]
    kept = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/runs/{a}/checkpoints").stdout.split()
    assert kept, "the stopped run kept no checkpoint"
    # status.yml: the run's records, and below their first line the job's end as Slurm has it
    status = queued["a_status"]
    assert status.rc == 0, status.tail()
    assert f"run {a}: stopped" in status.stdout, status.tail()
    assert queued["a_state"] == "CANCELLED"
    assert f"Slurm job {queued['job_a']}: CANCELLED" in status.stdout, status.tail()


def test_the_epilog_removes_a_container_its_job_left_behind(cluster: Any) -> None:
    """A job whose task started a labelled container and ended without it (as one SIGKILLed
    after KillWait would): the epilog removes it once the job has ended."""
    node, slurm_name = cluster.nodes[-1], slurm_names(cluster)[-1]
    image = cluster.ssh(node, "cat /etc/ddpfleet/trainer_image").stdout.strip()
    name = f"e2e-{STAMP}-epilog"
    job = cluster.ssh(
        cluster.nodes[0],
        f"sbatch --parsable --nodelist={slurm_name} --output=/dev/null --wrap "
        f"'docker run -d --name {name} --label io.ddpfleet.slurm_job=$SLURM_JOB_ID "
        f"--entrypoint sleep {image} 600'",
    )
    assert job.returncode == 0, job.stderr
    deadline = time.monotonic() + 60
    seen, gone = False, False
    while time.monotonic() < deadline and not gone:
        here = cluster.ssh(node, f"docker ps -aq --filter name={name}").stdout.strip()
        seen = seen or bool(here)
        ended = squeue(cluster, f"--jobs={job.stdout.strip()}") == ""
        gone = ended and not here
        time.sleep(0.5)
    cluster.ssh(node, f"docker rm -f {name}")
    assert gone, "the job's container outlived the job"


@pytest.mark.parametrize(
    ("partition", "message"),
    [
        ("nosuch", "train_partition nosuch: no such Slurm partition"),
        ("pair", "preflight failed: Slurm partition pair lacks {last}: the run needs every "
         "trainer (3 hosts), the partition has 2"),
    ],
)  # fmt: skip
def test_a_partition_without_every_trainer_is_refused_before_submission(
    cluster: Any, partition: str, message: str
) -> None:
    rid = run_id(f"part-{partition}")
    names = slurm_names(cluster)
    message = message.format(last=names[-1])
    make = f"scontrol create partition=pair nodes={','.join(names[:2])} state=up"
    assert cluster.ssh(cluster.nodes[0], make).returncode == 0
    try:
        run = train(cluster, rid, *SLURM, "-e", f"train_partition={partition}")
    finally:
        cluster.ssh(cluster.nodes[0], "scontrol delete partition=pair")
    assert run.rc != 0
    assert message in run.stdout, run.tail()
    assert "Submit the run as one Slurm job" not in run.stdout
    assert squeue(cluster, f"--name=ddpfleet-{rid}") == ""
    assert containers(cluster, rid) == {}
