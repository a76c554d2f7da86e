"""A run container's parameters, built once and used by every path that starts it.

``container_params`` (the filter ``ddpfleet_container_params``) builds them under
docker_container's option names, which start.yml passes on as they are. The slurm role's task
program turns the same parameters into ``docker run`` with ``docker_run_argv``, which refuses
one it has no form for: a parameter never reaches one path only.

Standard library only, nothing else of this package: the slurm role installs this file beside
its task program (roles/slurm/files/ links to it), which runs with the host's python3.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable

JOB_LABEL = "io.ddpfleet.slurm_job"  # a run container started by a Slurm job carries its id
# A CPU quota's CFS period, in microseconds. Docker's --cpus keeps the kernel's 100 ms: a
# container that used its share early in a period (a rank's burst of compute, its loader
# workers) is stopped for the rest of it, up to tens of ms, and every other rank waits for it at
# the next all-reduce; equal hosts under equal quotas then measured 0.56-1.67x of each other,
# by when their bursts fell (2-core EPYC, tests/e2e/test_46_stragglers.py), which the
# straggler detector would take for slow hosts. At 10 ms a stop lasts a few ms and each host
# runs at its quota's pace. The kernel's least quota is 1 ms: a quota under 0.1 CPU gets a
# longer period.
CPU_PERIOD_US = 10_000
CPU_QUOTA_MIN_US = 1_000


def cpu_limits(cpus: float) -> tuple[int, int]:
    """(CFS period, quota) in microseconds for a quota of ``cpus`` CPUs (> 0); the period is
    long enough that the quota is at least the kernel's least."""
    cpus = float(cpus)
    period = max(CPU_PERIOD_US, math.ceil(CPU_QUOTA_MIN_US / cpus))
    return period, round(cpus * period)


def container_params(
    *,
    name: str,
    image: str,
    run_id: str,
    host: str,
    node_rank: int,
    user: str,
    working_dir: str,
    datasets: str,
    run_dir: str,
    fallback_dir: str,
    ipc_host: bool,
    shm_size_mb: int,
    ulimits: list[str],
    cpus: float,
    gpus: int,
    devices: list[str],
    env: dict[str, str],
    entrypoint: list[str],
    command: list[str],
) -> dict:
    """The run container of ``host``: PID 1 ``entrypoint + command`` (the run agent), on the
    host's network; of the storage only the data sets (read-only), the run directory and the
    host's own record directory of the run; removed when it exits (every record is written by
    then), never restarted, never pulled. ``ipc_host``: the host's IPC and /dev/shm, else a
    private /dev/shm; ``cpus`` (a CPU quota, in :func:`cpu_limits`' periods), ``gpus``: 0 for
    none; ``devices``: ``path:path:rwm``."""
    params: dict = {
        "name": name,
        "image": image,
        "pull": "never",
        "restart_policy": "no",
        "auto_remove": True,
        "init": False,
        "network_mode": "host",
        # the forensics bundle's py-spy reads the ranks' memory: its binary alone holds this
        # capability (a file capability, images/trainer/Dockerfile); the ranks and the agent not
        "capabilities": ["SYS_PTRACE"],
        "ulimits": list(ulimits),
        "user": user,
        "working_dir": working_dir,
        "mounts": [
            {"type": "bind", "source": datasets, "target": datasets, "read_only": True},
            {"type": "bind", "source": run_dir, "target": run_dir},
            {"type": "bind", "source": fallback_dir, "target": fallback_dir},
        ],
        "labels": {
            "io.ddpfleet.run_id": run_id,
            "io.ddpfleet.node_rank": str(int(node_rank)),
            "io.ddpfleet.host": host,
        },
        "env": {str(k): str(v) for k, v in env.items()},
        "entrypoint": list(entrypoint),
        "command": [str(word) for word in command],
    }
    if ipc_host:
        params["ipc_mode"] = "host"
    else:
        params["shm_size"] = f"{int(shm_size_mb)}M"
    if float(cpus) > 0:
        period, quota = cpu_limits(cpus)
        params["cpu_period"] = period
        params["cpu_quota"] = quota
    if int(gpus) > 0:
        params["device_requests"] = [
            {"driver": "nvidia", "count": int(gpus), "capabilities": [["gpu"]]}
        ]
    if devices:
        params["devices"] = list(devices)
    return params


def _flag(flag: str) -> Callable[[object], list[str]]:
    return lambda value: [f"{flag}={value}"]


def _mount(mount: dict) -> str:
    spec = f"type={mount['type']},source={mount['source']},target={mount['target']}"
    return "--mount=" + spec + (",readonly" if mount.get("read_only") else "")


# docker run's words for each parameter; after the image: the entrypoint's arguments, the command
DOCKER_RUN: dict[str, Callable] = {
    "name": lambda name: ["--name", name],
    "pull": _flag("--pull"),
    "restart_policy": _flag("--restart"),
    "auto_remove": lambda on: ["--rm"] if on else [],
    "init": lambda on: ["--init"] if on else [],
    "network_mode": lambda mode: ["--network", mode],
    "capabilities": lambda caps: [f"--cap-add={cap}" for cap in caps],
    "ipc_mode": _flag("--ipc"),
    "shm_size": _flag("--shm-size"),
    "cpu_period": _flag("--cpu-period"),
    "cpu_quota": _flag("--cpu-quota"),
    "user": _flag("--user"),
    "working_dir": _flag("--workdir"),
    "ulimits": lambda limits: ["--ulimit={}={}".format(*u.split(":", 1)) for u in limits],
    "device_requests": lambda requests: [f"--gpus={r['count']}" for r in requests],
    "devices": lambda devices: [f"--device={device}" for device in devices],
    "mounts": lambda mounts: [_mount(m) for m in mounts],
    "labels": lambda labels: [f"--label={k}={v}" for k, v in sorted(labels.items())],
    # the names alone: the values (train_env may hold tokens) reach docker through its
    # environment (docker_env), never a command line
    "env": lambda env: [f"--env={name}" for name in sorted(env)],
    "entrypoint": lambda words: [f"--entrypoint={words[0]}"] if words else [],
}
POSITIONAL = ("image", "command")


def docker_run_argv(params: dict, job_id: str) -> list[str]:
    """``docker run`` in the foreground for the parameters, labelled with the Slurm job;
    ValueError naming a parameter it has no form for."""
    unknown = sorted(params.keys() - DOCKER_RUN.keys() - set(POSITIONAL))
    if unknown:
        raise ValueError(f"no docker run form for the container parameter(s) {', '.join(unknown)}")
    params = {**params, "labels": {**params.get("labels", {}), JOB_LABEL: job_id}}
    argv = ["docker", "run"]
    for key, words in DOCKER_RUN.items():
        if key in params:
            argv += words(params[key])
    after = list(params.get("entrypoint", []))[1:]
    return [*argv, params["image"], *after, *params.get("command", [])]


def docker_env(params: dict) -> dict[str, str]:
    """The docker CLI's environment: this process's and the container's (``--env NAME``)."""
    return {**os.environ, **{k: str(v) for k, v in params.get("env", {}).items()}}
