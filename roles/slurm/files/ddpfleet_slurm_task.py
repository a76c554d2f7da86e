#!/usr/bin/env python3
"""ddpfleet's Slurm task: one on each node of a run's job (``srun --ntasks-per-node=1``).

It starts the run's container on this host from the parameters train.yml kept here
(``/var/lib/ddpfleet/launch/<run_id>.json``, root's alone; the same ones the direct launch
gives community.docker.docker_container), labelled with the job id, waits for it and exits
with its status. PID 1 of the container is the run agent, which supervises the run exactly as
in a direct launch.

Slurm's SIGTERM (scancel, the job's time limit), which Slurm sends to every process of the
task, is passed on as stop.yml does it: SIGTERM to the agent (the attached docker client
passes it on too; the agent takes one stop), which stops the run, the ranks checkpoint and
the container ends within train_stop_timeout. Slurm's KillWait (slurm.conf) gives that time;
the job's epilog (ddpfleet-slurm-epilog) removes a container still there once the job ended.

Standard library only: it runs with the host's python3, as root (the job's user). The
container's environment values (train_env may hold tokens) reach docker through this process's
environment, never its command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

JOB_LABEL = "io.ddpfleet.slurm_job"


def docker_run_argv(params: dict, job_id: str) -> list[str]:
    """``docker run`` in the foreground for the kept parameters (docker_container's names)."""
    argv = ["docker", "run", "--rm", "--restart=no", "--pull=never"]
    argv += ["--name", params["name"], "--network", params.get("network_mode", "host")]
    argv += [f"--cap-add={cap}" for cap in params.get("capabilities", [])]
    for key, flag in (("ipc_mode", "--ipc"), ("shm_size", "--shm-size"), ("cpus", "--cpus"),
                      ("user", "--user"), ("working_dir", "--workdir")):  # fmt: skip
        if key in params:
            argv.append(f"{flag}={params[key]}")
    for ulimit in params.get("ulimits", []):  # name:soft:hard
        name, limits = ulimit.split(":", 1)
        argv.append(f"--ulimit={name}={limits}")
    for request in params.get("device_requests", []):
        argv.append(f"--gpus={request['count']}")
    argv += [f"--device={device}" for device in params.get("devices", [])]
    for mount in params.get("mounts", []):
        spec = f"type={mount['type']},source={mount['source']},target={mount['target']}"
        argv.append("--mount=" + spec + (",readonly" if mount.get("read_only") else ""))
    labels = {**params.get("labels", {}), JOB_LABEL: job_id}
    argv += [f"--label={key}={value}" for key, value in sorted(labels.items())]
    argv += [f"--env={name}" for name in sorted(params.get("env", {}))]
    entrypoint = list(params.get("entrypoint", []))
    if entrypoint:
        argv.append(f"--entrypoint={entrypoint[0]}")
    return [*argv, params["image"], *entrypoint[1:], *params.get("command", [])]


def docker_env(params: dict) -> dict[str, str]:
    """The docker CLI's environment: this process's, with the container's values (--env NAME
    takes each from it)."""
    return {**os.environ, **{k: str(v) for k, v in params.get("env", {}).items()}}


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: ddpfleet-slurm-task <kept container parameters (json)>", file=sys.stderr)
        return 2
    job_id = os.environ.get("SLURM_JOB_ID", "")
    with open(argv[1], encoding="utf-8") as spec:
        params = json.load(spec)["params"]
    name = params["name"]
    host = os.uname().nodename

    def stop(signum: int, _frame: object) -> None:
        print(f"ddpfleet-slurm-task on {host}: {signal.Signals(signum).name} from Slurm "
              f"(job {job_id}): stopping {name} as stop.yml does", flush=True)  # fmt: skip
        subprocess.run(["docker", "kill", "--signal", "TERM", name], check=False,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip

    print(f"ddpfleet-slurm-task on {host}: starting {name} (job {job_id})", flush=True)
    # Slurm signals every process of the task. The attached docker client passes a signal on
    # to the container (its agent stops the run) and stays until the container has ended; a
    # client that would rather die of it (one that does not pass signals on) inherits ignoring
    # it: an ignored signal stays ignored across exec.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    proc = subprocess.Popen(docker_run_argv(params, job_id), env=docker_env(params))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    code = proc.wait()  # a signal's handler runs in between, and the wait goes on (PEP 475)
    print(f"ddpfleet-slurm-task on {host}: {name} exited with {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
