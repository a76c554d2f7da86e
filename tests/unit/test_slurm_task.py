"""roles/slurm/files/ddpfleet_slurm_task.py, the program each node of a run's Slurm job runs:
the ``docker run`` it makes of the parameters train.yml keeps (launch.yml's, the same ones a
direct launch gives docker_container), and its handling of Slurm's SIGTERM, run for real
against a stand-in ``docker`` on PATH (a shell script that records its arguments and waits)."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from time_bounds import within

from ddpfleet_agent.container import container_params

ROOT = Path(__file__).resolve().parents[2]
TASK = ROOT / "roles" / "slurm" / "files" / "ddpfleet_slurm_task.py"
SPEC = importlib.util.spec_from_file_location("ddpfleet_slurm_task", TASK)
task = importlib.util.module_from_spec(SPEC)  # type: ignore[arg-type]
SPEC.loader.exec_module(task)  # type: ignore[union-attr]

# what launch.yml keeps: the one builder's parameters (ddpfleet_agent/container.py)
PARAMS = container_params(
    name="ddpfleet-r1-node2", image="10.0.0.11:5000/ddpfleet/trainer:abc", run_id="r1",
    host="node2", node_rank=1, user="2000:2000", working_dir="/srv/ddpfleet/runs/r1",
    datasets="/srv/d/datasets", run_dir="/srv/d/runs/r1", fallback_dir="/var/lib/ddpfleet/runs/r1",
    ipc_host=False, shm_size_mb=2048, ulimits=["memlock:-1:-1", "stack:67108864:67108864"],
    cpus=0.5, gpus=8, devices=["/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm"],
    env={"HOME": "/tmp", "HF_TOKEN": "s3cret"}, entrypoint=["python", "-m", "ddpfleet_agent"],
    command=["--run-id=r1", "--", "torchrun", "--nnodes=3", "-m", "trainer"],
)  # fmt: skip


def test_docker_run_has_every_kept_parameter_and_the_job_label() -> None:
    argv = task.docker_run_argv(PARAMS, "42")
    image = argv.index(PARAMS["image"])
    options, command = argv[:image], argv[image + 1 :]
    assert options[:2] == ["docker", "run"]
    for option in [
        "--rm", "--pull=never", "--restart=no", "--cap-add=SYS_PTRACE", "--shm-size=2048M",
        "--ulimit=memlock=-1:-1", "--ulimit=stack=67108864:67108864", "--cpu-period=10000",
        "--cpu-quota=5000", "--gpus=8",
        "--device=/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm", "--user=2000:2000",
        "--workdir=/srv/ddpfleet/runs/r1",
        "--mount=type=bind,source=/srv/d/datasets,target=/srv/d/datasets,readonly",
        "--mount=type=bind,source=/srv/d/runs/r1,target=/srv/d/runs/r1",
        "--label=io.ddpfleet.run_id=r1", "--label=io.ddpfleet.node_rank=1",
        "--label=io.ddpfleet.slurm_job=42", "--entrypoint=python", "--env=HF_TOKEN", "--env=HOME",
    ]:  # fmt: skip
        assert option in options, option
    assert options[options.index("--name") + 1] == "ddpfleet-r1-node2"
    assert options[options.index("--network") + 1] == "host"
    assert command == ["-m", "ddpfleet_agent", *PARAMS["command"]]
    # train_env's values never reach the command line: docker takes them from its environment
    assert not any("s3cret" in word for word in argv)
    assert task.docker_env(PARAMS)["HF_TOKEN"] == "s3cret"


def test_optional_parameters_are_left_out() -> None:
    params = {k: PARAMS[k] for k in ("name", "image", "user", "mounts", "labels", "command")}
    argv = task.docker_run_argv(params, "7")
    assert not [w for w in argv if w.startswith(("--gpus", "--cpu-", "--ipc", "--device"))]
    assert argv[-len(params["command"]) - 1 :] == [params["image"], *params["command"]]


def test_a_parameter_without_a_docker_run_form_fails_the_task_in_one_line(tmp_path: Path) -> None:
    """A kept parameter this program has no form for is never dropped: the task exits 2."""
    spec = tmp_path / "r1.json"
    spec.write_text(json.dumps({"secret": False, "attempt": "a1",
                                "params": {**PARAMS, "oom_killer": False}}))  # fmt: skip
    proc = subprocess.run([sys.executable, str(TASK), str(spec)], capture_output=True,
                          text=True, timeout=within(30), check=False)  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"ddpfleet-slurm-task on {os.uname().nodename}: no docker run form for the container "
        "parameter(s) oom_killer"
    ]


def test_slurm_s_sigterm_stops_the_container_as_stop_yml_does(tmp_path: Path) -> None:
    """SIGTERM to the task and its children (scancel): the attached `docker run` lives on,
    the task calls `docker kill --signal TERM <name>`, waits for `docker run` to end and exits
    with its status."""
    log = tmp_path / "docker.log"
    fake = tmp_path / "bin" / "docker"
    fake.parent.mkdir()
    # `docker run` waits until `docker kill` has been called, then exits 3 (as the container)
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$1 $HF_TOKEN" >> {log}\n'
        f'if [ "$1" = run ]; then while ! grep -q kill {log}; do sleep 0.05; done; exit 3; fi\n'
        f'echo "$@" >> {log}\n'
    )
    fake.chmod(0o755)
    spec = tmp_path / "r1.json"
    spec.write_text(json.dumps({"secret": True, "attempt": "a1", "params": PARAMS}))
    env = {**os.environ, "PATH": f"{fake.parent}:{os.environ['PATH']}", "SLURM_JOB_ID": "42"}
    # its own process group: SIGTERM goes to every process of it, as Slurm signals a task's
    proc = subprocess.Popen([sys.executable, str(TASK), str(spec)], env=env, text=True,
                            stdout=subprocess.PIPE, start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + within(10)
    while not (log.exists() and "run" in log.read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGTERM)
    out, _ = proc.communicate(timeout=within(10))
    assert proc.returncode == 3
    lines = log.read_text().splitlines()
    assert lines[0] == "run s3cret"  # the token reached docker through its environment
    assert "kill --signal TERM ddpfleet-r1-node2" in lines
    assert "SIGTERM from Slurm (job 42): stopping ddpfleet-r1-node2" in out
    assert "ddpfleet-r1-node2 exited with 3" in out
