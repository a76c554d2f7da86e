"""Filters of the trainer_run role: the trainer's options and command line (trainer.config,
from the one declaration in trainer/options.py) and the run agent's flags of those options,
the run container's parameters (ddpfleet_agent.container), peers, fabric, ulimits, the hosts'
container states and status.yml's report from the hosts' own records (ddpfleet_agent.follow),
a Slurm run's sbatch command and queue (ddpfleet_agent.slurm), and the run agent's archive for
a user's program (ddpfleet_agent.shipping).
The option checks are the ddpfleet_run_validate action's."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # this checkout's trainer package
from ddpfleet_agent.container import container_params
from ddpfleet_agent.follow import container_states, fallback_report
from ddpfleet_agent.shipping import lib_archive
from ddpfleet_agent.slurm import job_id, job_line, queue_position, queued, sbatch_argv
from trainer.config import command_args, command_options
from trainer.options import agent_args, as_bool


def container(inputs: dict) -> dict:
    """The run container's parameters (ddpfleet_agent.container.container_params) from
    launch.yml's mapping of its arguments."""
    return container_params(**inputs)


def peers(hosts: list[str], hostvars: object) -> list[dict]:
    """[{name, hostname, cluster_ip}] of each host (hostname: node_hostname or the name)."""
    out = []
    for name in hosts:
        hv = hostvars[name]  # type: ignore[index]
        if "cluster_ip" not in hv:
            raise ValueError(f"host {name} has no cluster_ip")
        hostname = str(hv.get("node_hostname") or name)
        out.append({"name": name, "hostname": hostname, "cluster_ip": str(hv["cluster_ip"])})
    return out


def fabric(ib_devices: list, settings: dict, numa_binding: str = "", gpus: int = 0) -> dict:
    """The run container's fabric options: {devices, env, torchrun_args, problems}.

    With InfiniBand/RoCE devices (``/dev/infiniband/*``, found by preflight) and the host
    variable ``infiniband`` not false, each device goes into the container (rwm) and every
    inventory variable ``nccl_ib_<name>`` becomes ``NCCL_IB_<NAME>`` (``nccl_ib_hca:
    mlx5_0,mlx5_1`` -> ``NCCL_IB_HCA``; ``nccl_ib_gid_index: 3`` for RoCE v2). nccl_ib_*
    settings on a host without devices would do nothing: a problem, as is NUMA binding (torchrun
    binds each rank near its GPU) on a host that runs no GPUs."""
    use_ib = bool(ib_devices) and as_bool(settings.get("infiniband", True))
    ib_vars = {k: v for k, v in sorted(settings.items()) if k.startswith("nccl_ib_")}
    problems = []
    if ib_vars and not use_ib:
        why = "infiniband is false" if ib_devices else "there is no /dev/infiniband"
        problems.append(f"{', '.join(ib_vars)} set but {why}")
    if numa_binding and int(gpus) <= 0:
        problems.append(f"train_numa_binding={numa_binding} needs GPUs (binds ranks near theirs)")
    env = {}
    for name, value in ib_vars.items() if use_ib else ():
        if isinstance(value, (dict, list)) or value is None:
            raise ValueError(f"{name} must be a scalar, got {value!r}")
        env[name.upper()] = str(value).lower() if isinstance(value, bool) else str(value)
    return {
        "devices": [f"{d}:{d}:rwm" for d in sorted(ib_devices)] if use_ib else [],
        "env": env,
        "torchrun_args": [f"--numa-binding={numa_binding}"] if numa_binding else [],
        "problems": problems,
    }


def hide_values(mapping: dict) -> dict:
    """{name: "(hidden)"} for each name: what a record may say of train_env (its values may be
    tokens; the run's containers get them from the task, never from a file)."""
    return dict.fromkeys(sorted(mapping or {}), "(hidden)")


def ulimits(wanted: dict, granted: dict) -> list[str]:
    """docker_container ulimits ('name:soft:hard'): each wanted value (-1 = unlimited) capped
    to what the engine may grant (-1 = anything)."""
    out = []
    for name in sorted(wanted):
        want, cap = int(wanted[name]), int(granted.get(name, -1))
        value = want if cap == -1 else cap if want == -1 else min(want, cap)
        out.append(f"{name}:{value}:{value}")
    return out


class FilterModule:
    """ddpfleet trainer_run filters."""

    def filters(self) -> dict:
        return {
            "ddpfleet_trainer_args": command_args,
            "ddpfleet_trainer_options": command_options,
            "ddpfleet_agent_args": agent_args,
            "ddpfleet_container_params": container,
            "ddpfleet_peers": peers,
            "ddpfleet_ulimits": ulimits,
            "ddpfleet_fabric": fabric,
            "ddpfleet_hide_values": hide_values,
            "ddpfleet_fallback_report": fallback_report,
            "ddpfleet_container_states": container_states,
            "ddpfleet_agent_lib": lib_archive,
            "ddpfleet_sbatch": sbatch_argv,
            "ddpfleet_slurm_job": job_id,
            "ddpfleet_queue_position": queue_position,
            "ddpfleet_slurm_queued": queued,
            "ddpfleet_slurm_job_line": job_line,
        }
