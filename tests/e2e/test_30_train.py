"""train.yml, status.yml and stop.yml on the sandbox: real torchrun containers on every node.

A short synthetic run completes with world size = nodes x processes; a run on a generated
ImageFolder data set on the shared storage; a rank's container killed mid-run brings every
container of the run down within 15 s and the failure names that host, and the re-run
resumes from the newest checkpoint; stop.yml then resume; status.yml; every bad input is
refused with one line before anything starts. Prints launch-to-first-step and teardown times.
"""

from __future__ import annotations

import calendar
import contextlib
import json
import re
import subprocess
import time
from typing import Any

import pytest
from site_fixtures import PlaybookRun, run_site

SHARED = "/mnt/ddpfleet"
TEARDOWN_LIMIT_S = 15
STAMP = time.strftime("%H%M%S")
# Short runs: 3 ranks share 2 cores. Each rank logs every step so progress is visible.
FAST = ["-e", "train_log_every=1", "-e", "train_omp_num_threads=1", "-e", "train_workers=0"]


def run_id(name: str) -> str:
    return f"e2e-{STAMP}-{name}"


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest, sandbox: Any) -> Any:
    """The provisioned sandbox (site.yml applied once; the lead's `provisioned` fixture)."""
    # Without the shared fixture, test_20_site (file order) ran site.yml before this module.
    with contextlib.suppress(pytest.FixtureLookupError):
        request.getfixturevalue("provisioned")
    probe = sandbox.ssh(sandbox.nodes[0], "cat /etc/ddpfleet/trainer_image")
    assert probe.returncode == 0, "site.yml has not provisioned the sandbox: " + probe.stderr
    yield sandbox
    for node in sandbox.nodes:  # our containers only (label io.ddpfleet.run_id=e2e-<stamp>-*)
        sandbox.ssh(
            node,
            "docker ps -aq --filter label=io.ddpfleet.run_id | xargs -r docker inspect "
            "--format '{{.Name}} {{index .Config.Labels \"io.ddpfleet.run_id\"}}' "
            f"| awk '$2 ~ /^e2e-{STAMP}-/ {{print $1}}' | xargs -r docker rm -f",
        )
    sandbox.ssh(
        sandbox.nodes[0], f"rm -rf {SHARED}/runs/e2e-{STAMP}-* {SHARED}/datasets/e2e-{STAMP}"
    )


def train(sandbox: Any, rid: str | None, *args: str) -> PlaybookRun:
    extra = ["-e", f"run_id={rid}"] if rid is not None else []
    return run_site(sandbox, *extra, *FAST, *args, playbook="train.yml")


def start_train(sandbox: Any, rid: str, *args: str) -> subprocess.Popen[str]:
    cmd = [
        str(sandbox.root / ".venv" / "bin" / "ansible-playbook"),
        "-i", str(sandbox.inventory), "train.yml", "-e", f"run_id={rid}", *FAST, *args,
    ]  # fmt: skip
    return subprocess.Popen(
        cmd, cwd=sandbox.root, env=sandbox.env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip


def run_file(sandbox: Any, rid: str, name: str) -> str:
    proc = sandbox.ssh(sandbox.nodes[0], f"cat {SHARED}/runs/{rid}/{name}")
    assert proc.returncode == 0, f"{name}: {proc.stderr}"
    return proc.stdout


def summary(sandbox: Any, rid: str) -> dict:
    return json.loads(run_file(sandbox, rid, "summary.json"))


def containers(sandbox: Any, rid: str) -> dict[str, list[str]]:
    """Containers (any state) labelled with the run id, per node."""
    found = {}
    for node in sandbox.nodes:
        proc = sandbox.ssh(node, f"docker ps -aq --filter label=io.ddpfleet.run_id={rid}")
        assert proc.returncode == 0, proc.stderr
        if proc.stdout.split():
            found[node.name] = proc.stdout.split()
    return found


def heartbeat_step(sandbox: Any, rid: str, rank: int) -> int:
    proc = sandbox.ssh(sandbox.nodes[0], f"cat {SHARED}/runs/{rid}/heartbeat/rank-{rank}.json")
    try:
        return int(json.loads(proc.stdout)["step"])
    except (ValueError, KeyError):
        return -1


def wait_for_step(sandbox: Any, rid: str, step: int, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 420
    while heartbeat_step(sandbox, rid, len(sandbox.nodes) - 1) < step:
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < deadline, f"run {rid} never reached step {step}"
        time.sleep(1)


def launch_to_first_step(sandbox: Any, rid: str) -> float:
    """Seconds from rank 0's launch wrapper starting to rank 0 logging its first step (UTC)."""
    launched = re.search(
        r"^ddpfleet: (\S+) node_rank 0", run_file(sandbox, rid, "nodes/node1.log"), re.M
    )
    first = re.search(
        r"^(\S+ \S+),(\d+) rank0 INFO step 1/", run_file(sandbox, rid, "logs/rank-0.log"), re.M
    )
    assert launched, "no launch line in nodes/node1.log"
    assert first, "no first step in rank 0's log"
    t_launch = calendar.timegm(time.strptime(launched.group(1), "%Y-%m-%dT%H:%M:%SZ"))
    t_first = calendar.timegm(time.strptime(first.group(1), "%Y-%m-%d %H:%M:%S"))
    return t_first + int(first.group(2)) / 1000 - t_launch


# --- a short synthetic run ----------------------------------------------------------------


@pytest.fixture(scope="module")
def synthetic(cluster: Any) -> tuple[str, PlaybookRun]:
    rid = run_id("syn")
    run = train(cluster, rid, "-e", "train_max_steps=8")
    print(f"\ntrain.yml synthetic run: {run.wall_s:.1f} s, rc {run.rc}")
    return rid, run


def test_synthetic_run_completes_on_every_node(cluster: Any, synthetic) -> None:
    rid, run = synthetic
    assert run.rc == 0, run.tail()
    data = summary(cluster, rid)
    assert data["status"] == "completed"
    assert data["world_size"] == len(cluster.nodes) * 1
    assert data["steps"] == 8
    assert len(data["per_rank_images_per_sec"]) == len(cluster.nodes)
    for node in cluster.nodes:
        code = json.loads(run_file(cluster, rid, f"nodes/{node.name}.exit"))["exit_code"]
        assert code == 0, node.name
    assert containers(cluster, rid) == {}
    print(f"launch to first step: {launch_to_first_step(cluster, rid):.1f} s")


def test_report_table_and_plot(cluster: Any, synthetic) -> None:
    rid, run = synthetic
    assert f"run {rid} completed" in run.stdout
    assert re.search(r"^\s*\"?\s*total\s+\d+\.\d", run.stdout, re.M), run.tail()
    assert "final loss" in run.stdout
    head = cluster.ssh(cluster.nodes[0], f"head -c 8 {SHARED}/runs/{rid}/report.png | od -An -c")
    assert "P   N   G" in head.stdout
    config = json.loads(run_file(cluster, rid, "config.json"))
    assert config["world_size"] == len(cluster.nodes)
    assert [n["name"] for n in config["nodes"]] == [n.name for n in cluster.nodes]


def test_rerun_of_a_completed_run_changes_nothing(cluster: Any, synthetic) -> None:
    rid, _ = synthetic
    again = train(cluster, rid)
    assert again.rc == 0, again.tail()
    assert f"run {rid} already completed; nothing to do" in again.stdout
    assert again.changed_hosts() == {}
    assert containers(cluster, rid) == {}


def test_status_of_a_completed_run(cluster: Any, synthetic) -> None:
    rid, _ = synthetic
    status = run_site(cluster, "-e", f"run_id={rid}", playbook="status.yml")
    assert status.rc == 0, status.tail()
    assert f"run {rid}: completed" in status.stdout
    for node in cluster.nodes:
        assert f"{node.name}: container absent; launcher exit code 0" in status.stdout
    assert "summary: status completed, steps 8" in status.stdout


# --- failure, teardown, root cause and resume ------------------------------------------------


@pytest.fixture(scope="module")
def killed(cluster: Any) -> dict:
    rid = run_id("kill")
    victim = cluster.nodes[1]
    proc = start_train(cluster, rid, "-e", "train_max_steps=14", "-e", "train_checkpoint_every=2")
    try:
        wait_for_step(cluster, rid, 4, proc)
        kill = cluster.ssh(victim, f"docker kill ddpfleet-{rid}-{victim.name}")
        killed_at = time.monotonic()
        assert kill.returncode == 0, kill.stderr
        while containers(cluster, rid) and time.monotonic() - killed_at < 60:
            time.sleep(0.5)
        gone_s = time.monotonic() - killed_at
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nrank container killed -> every container of the run gone: {gone_s:.1f} s")
    return {"rid": rid, "victim": victim, "gone_s": gone_s, "rc": proc.returncode, "out": out}


def test_killed_rank_brings_every_container_down_within_15s(killed: dict) -> None:
    assert killed["gone_s"] <= TEARDOWN_LIMIT_S


def test_failure_names_the_host_and_rank(cluster: Any, killed: dict) -> None:
    victim = killed["victim"]
    assert killed["rc"] != 0
    cause = f"run {killed['rid']} failed: host {victim.name} rank 1: container was killed"
    assert cause in killed["out"], killed["out"][-3000:]
    failure = summary(cluster, killed["rid"])["failure"]
    assert summary(cluster, killed["rid"])["status"] == "failed"
    assert (failure["host"], failure["rank"], failure["exit_code"]) == (victim.name, 1, 137)
    assert failure["log_tail"]


def test_rerun_of_a_failed_run_resumes_from_the_checkpoint(cluster: Any, killed: dict) -> None:
    rid = killed["rid"]
    run = train(cluster, rid, "-e", "train_max_steps=14", "-e", "train_checkpoint_every=2")
    assert run.rc == 0, run.tail()
    assert f"resuming run {rid}" in run.stdout
    data = summary(cluster, rid)
    assert data["status"] == "completed"
    assert data["steps"] == 14
    assert data["resumed_from_step"] >= 2


# --- ImageFolder data on the shared storage ----------------------------------------------


@pytest.fixture(scope="module")
def dataset(cluster: Any) -> str:
    """A JPEG ImageFolder data set on the shared storage, written by the training image."""
    name = f"e2e-{STAMP}"
    image = cluster.ssh(cluster.nodes[0], "cat /etc/ddpfleet/trainer_image").stdout.strip()
    made = cluster.ssh(
        cluster.nodes[0],
        f"docker run --rm --user 2000:2000 --network none -v {SHARED}:{SHARED} "
        f"--entrypoint python {image} -m trainer.make_dataset --out {SHARED}/datasets/{name} "
        "--classes 4 --train-per-class 12 --val-per-class 4 --size 48",
        timeout=300,
    )
    assert made.returncode == 0, made.stdout + made.stderr
    return name


def test_imagefolder_run_on_shared_storage(cluster: Any, dataset: str) -> None:
    rid = run_id("folder")
    run = train(
        cluster, rid, "-e", "train_synthetic=false", "-e", f"train_data_dir={dataset}",
        "-e", "train_max_steps=0", "-e", "train_epochs=1", "-e", "train_batch_size=4",
    )  # fmt: skip
    assert run.rc == 0, run.tail()
    data = summary(cluster, rid)
    assert data["status"] == "completed"
    assert data["world_size"] == len(cluster.nodes)
    assert data["steps"] == 48 // (4 * len(cluster.nodes))
    assert data["final_accuracy"] is not None


# --- stop: status while running, refusal, stop, resume ------------------------------------

STOP_STEPS = 100  # long enough that status.yml and the refused train.yml run before it ends


def stoppable(dataset: str) -> list[str]:
    """ImageFolder with loader workers: torchrun's SIGTERM reaches each rank's process group."""
    return [
        "-e", f"train_max_steps={STOP_STEPS}", "-e", "train_checkpoint_every=0",
        "-e", "train_synthetic=false", "-e", f"train_data_dir={dataset}",
        "-e", "train_batch_size=4", "-e", "train_workers=1",
    ]  # fmt: skip


@pytest.fixture(scope="module")
def stopped(cluster: Any, dataset: str) -> dict:
    rid = run_id("stop")
    proc = start_train(cluster, rid, *stoppable(dataset))
    try:
        wait_for_step(cluster, rid, 3, proc)
        status = run_site(cluster, "-e", f"run_id={rid}", playbook="status.yml")
        refused = train(cluster, rid)
        stop = run_site(cluster, "-e", f"run_id={rid}", playbook="stop.yml")
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nstop.yml: {stop.wall_s:.1f} s")
    return {
        "rid": rid,
        "status": status,
        "refused": refused,
        "stop": stop,
        "train_rc": proc.returncode,
        "train_out": out,
    }


def test_status_of_a_running_run(stopped: dict, cluster: Any) -> None:
    status = stopped["status"]
    assert status.rc == 0, status.tail()
    assert f"run {stopped['rid']}: running" in status.stdout
    for node in cluster.nodes:
        assert f"{node.name}: container running" in status.stdout
    assert re.search(r"rank 2: step \d+, heartbeat [\d.]+ s ago", status.stdout)


def test_train_refuses_a_running_run(stopped: dict) -> None:
    refused = stopped["refused"]
    assert refused.rc != 0
    assert f"run {stopped['rid']} is already running on node1, node2, node3" in refused.stdout


def test_stop_checkpoints_and_marks_the_run_stopped(stopped: dict, cluster: Any) -> None:
    stop = stopped["stop"]
    assert stop.rc == 0, stop.tail()
    data = summary(cluster, stopped["rid"])
    assert data["status"] == "stopped"
    assert "stopped (as recorded by the trainer)" in stop.stdout, stop.tail()  # not stop.yml's
    ckpts = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/runs/{stopped['rid']}/checkpoints")
    assert re.search(r"step-\d+\.pt", ckpts.stdout), ckpts.stdout
    assert containers(cluster, stopped["rid"]) == {}
    assert stopped["train_rc"] == 0, stopped["train_out"][-3000:]
    assert f"run {stopped['rid']} was stopped" in stopped["train_out"]


def test_train_resumes_a_stopped_run(stopped: dict, cluster: Any, dataset: str) -> None:
    rid = stopped["rid"]
    before = summary(cluster, rid)["steps"]
    run = train(cluster, rid, *stoppable(dataset))
    assert run.rc == 0, run.tail()
    assert f"resuming run {rid}" in run.stdout
    data = summary(cluster, rid)
    assert data["status"] == "completed"
    assert data["resumed_from_step"] == before
    assert data["steps"] == STOP_STEPS


# --- bad input: one line, nothing started -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "args", "message"),
    [
        ("unknown", ["-e", "train_bach_size=8"], "unknown train option(s) train_bach_size"),
        (
            "no-data",
            ["-e", "train_synthetic=false", "-e", "train_data_dir=e2e-absent"],
            f"data dir {SHARED}/datasets/e2e-absent is absent on shared storage",
        ),
        (
            "no-image",
            ["-e", "train_image=ddpfleet/absent:0"],
            "image ddpfleet/absent:0 is not present",
        ),
    ],
)
def test_bad_input_is_refused_before_anything_starts(cluster: Any, name, args, message) -> None:
    rid = run_id(name)
    run = run_site(cluster, "-e", f"run_id={rid}", *args, playbook="train.yml")
    assert run.rc != 0
    assert message in run.stdout, run.tail()
    assert "Start the run's container" not in run.stdout
    assert containers(cluster, rid) == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [([], "run_id is required"), (["-e", "run_id=bad/id"], 'invalid run_id "bad/id"')],
)
def test_missing_or_invalid_run_id_is_refused(cluster: Any, args, message) -> None:
    run = run_site(cluster, *args, playbook="train.yml")
    assert run.rc != 0
    assert message in run.stdout, run.tail()
    assert "Read the run's state" not in run.stdout


def test_busy_rendezvous_port_is_refused(cluster: Any) -> None:
    rid = run_id("busy")
    port = 29555
    holder = cluster.ssh(
        cluster.nodes[0],
        "nohup python3 -c 'import socket,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,"
        f' socket.SO_REUSEADDR, 1); s.bind(("0.0.0.0", {port})); s.listen(); time.sleep(60)\' '
        ">/dev/null 2>&1 & echo $!",
    )
    assert holder.returncode == 0, holder.stderr
    try:
        time.sleep(1)
        run = train(cluster, rid, "-e", f"train_master_port={port}")
    finally:
        cluster.ssh(cluster.nodes[0], f"kill {holder.stdout.strip()}")
    assert run.rc != 0
    assert f"rendezvous port {port} is busy on node1" in run.stdout, run.tail()
    assert containers(cluster, rid) == {}
