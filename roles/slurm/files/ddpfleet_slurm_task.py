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
``docker run`` comes from ddpfleet_container.py, installed beside it (ddpfleet_agent/container.py:
the one form of the container's parameters every launch path shares). The container's
environment values (train_env may hold tokens) reach docker through this process's
environment, never its command line.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ddpfleet_container.py beside it
from ddpfleet_container import docker_env, docker_run_argv


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

    try:
        run = docker_run_argv(params, job_id)
    except ValueError as err:  # kept by a train.yml that this task program does not match
        print(f"ddpfleet-slurm-task on {host}: {err}", file=sys.stderr)
        return 2
    print(f"ddpfleet-slurm-task on {host}: starting {name} (job {job_id})", flush=True)
    # Slurm signals every process of the task. The attached docker client passes a signal on
    # to the container (its agent stops the run) and stays until the container has ended; a
    # client that would rather die of it (one that does not pass signals on) inherits ignoring
    # it: an ignored signal stays ignored across exec.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    proc = subprocess.Popen(run, env=docker_env(params))
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    code = proc.wait()  # a signal's handler runs in between, and the wait goes on (PEP 475)
    print(f"ddpfleet-slurm-task on {host}: {name} exited with {code}", flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
