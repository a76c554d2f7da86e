#!/usr/bin/python
"""Check one trainer host before a run starts (changes nothing): the checks are
ddpfleet_doctor.hostcheck's and .gpuplan's (module_utils links), this module runs them. It also
reads what preflight.yml asserts on (the image reference, the image, the shared-storage
token): one module call per host instead of four tasks, ~2 s of every launch."""

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.ddpfleet_gpuplan import parse_smi, plan
from ansible.module_utils.ddpfleet_hostcheck import (
    check_cpus,
    check_names,
    check_ports,
    check_rdma,
    check_shm,
    dockerd_pid,
    engine_ulimits,
    infiniband_devices,
)

DOCUMENTATION = r"""
module: ddpfleet_run_preflight
short_description: Check that a host can take part in a ddpfleet run
description:
- Every peer's hostname resolves to its cluster_ip; the free_ports can be bound; /dev/shm
  (host IPC) or memory (private shm) is big enough; the CPU quota fits the host's CPUs; the
  GPUs (nvidia-smi) are there, as many as asked for (by default every one found), no fewer
  than the processes per host, and of a supported compute capability;
  with /dev/infiniband, the engine grants unlimited memlock. Fails with one line naming the
  host and every problem found. Returns the GPUs to use, the InfiniBand devices and what the
  Docker engine may grant as ulimits.
options:
  host:
    description: inventory_hostname.
    type: str
    required: true
  peers:
    description: Each trainer as {name, hostname, cluster_ip}.
    type: list
    elements: dict
    required: true
  shm_mb:
    description: Minimum /dev/shm the ranks need, in MiB.
    type: int
    required: true
  ipc_host:
    description: Ranks use the host's /dev/shm (else a private shm of shm_mb).
    type: bool
    default: false
  gpus:
    description: GPUs to use (the inventory's C(gpus)); -1 uses every GPU found, 0 none.
    type: int
    default: -1
  nproc:
    description: Processes per host asked for (train_nproc_per_node; 0 one per GPU, or 1).
    type: int
    default: 0
  min_compute_capability:
    description: Lowest compute capability the training image's CUDA runs on.
    type: str
    default: "7.5"
  cpus:
    description: The run containers' Docker CPU quota (train_cpus); 0 is none.
    type: float
    default: 0.0
  free_ports:
    description: "Ports by name that must be free on this host, e.g. {metrics: 29502}."
    type: dict
    default: {}
  image:
    description: The training image (train_image); empty reads it from image_file.
    type: str
    default: ""
  image_file:
    description: Where site.yml recorded the training image's reference.
    type: str
    default: ""
  token_file:
    description: A file rank 0's host wrote on the shared storage, to be read back here.
    type: str
    default: ""
author: ddpfleet
"""

RETURN = r"""
ulimits:
  description: What the container engine may grant, {memlock, stack} in bytes (-1 unlimited).
  type: dict
  returned: always
gpus:
  description: GPUs the run uses on this host (the inventory's gpus, else every one found).
  type: int
  returned: always
gpu_models:
  description: Model names of the GPUs found.
  type: list
  returned: always
gpu_capabilities:
  description: Compute capability of each GPU found, as "X.Y".
  type: list
  returned: always
infiniband_devices:
  description: Character devices under /dev/infiniband (empty without RDMA hardware).
  type: list
  returned: always
image:
  description: The image (the option, else image_file's text); empty when neither is known.
  type: str
  returned: always
image_present:
  description: Whether the local Docker engine has the image.
  type: bool
  returned: always
token:
  description: What token_file holds here, or null when it cannot be read.
  type: str
  returned: always
"""


def check_gpus(
    module: AnsibleModule, wanted: int, nproc: int, minimum: str
) -> tuple[list[str], int, list[tuple[str, str]]]:
    """(problems, GPUs to use, [(model, capability)]) from nvidia-smi; a host without
    nvidia-smi has no GPUs (and must not be asked for any)."""
    found: list[tuple[str, str]] = []
    smi = module.get_bin_path("nvidia-smi") if wanted != 0 else None
    if smi:
        query = [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"]
        rc, out, err = module.run_command(query)
        if rc != 0:
            return [f"nvidia-smi failed: {(err or out).strip() or rc}"], 0, []
        found = parse_smi(out)
    problems, gpus = plan(found, wanted, nproc, minimum)
    return problems, gpus, found


def read_text(path: str) -> str | None:
    """The file's text, stripped; None where it cannot be read (absent, not shared, no path)."""
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read(1 << 16).strip()
    except (OSError, UnicodeDecodeError):
        return None


def image_present(module: AnsibleModule, image: str) -> bool:
    """Whether this host's Docker engine has the image, by name or digest (docker inspect)."""
    docker = module.get_bin_path("docker")
    if not image or not docker:
        return False
    rc, _, _ = module.run_command([docker, "image", "inspect", "--format", "{{.Id}}", image])
    return rc == 0


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "host": {"type": "str", "required": True},
            "peers": {"type": "list", "elements": "dict", "required": True},
            "shm_mb": {"type": "int", "required": True},
            "ipc_host": {"type": "bool", "default": False},
            "gpus": {"type": "int", "default": -1},
            "nproc": {"type": "int", "default": 0},
            "min_compute_capability": {"type": "str", "default": "7.5"},
            "cpus": {"type": "float", "default": 0.0},
            "free_ports": {"type": "dict", "default": {}},
            "image": {"type": "str", "default": ""},
            "image_file": {"type": "str", "default": ""},
            "token_file": {"type": "str", "default": ""},
        },
        supports_check_mode=True,
    )
    p = module.params
    problems = check_names(p["peers"]) + check_shm(p["shm_mb"], p["ipc_host"])
    problems += check_cpus(p["cpus"], len(os.sched_getaffinity(0))) + check_ports(p["free_ports"])
    gpu_problems, gpus, found = check_gpus(
        module, p["gpus"], p["nproc"], p["min_compute_capability"]
    )
    granted, ib = engine_ulimits(dockerd_pid()), infiniband_devices()
    problems += gpu_problems + check_rdma(ib, granted)
    if problems:
        module.fail_json(msg=f"preflight failed on {p['host']}: " + "; ".join(problems))
    image = p["image"] or read_text(p["image_file"]) or ""
    module.exit_json(
        changed=False,
        image=image,
        image_present=image_present(module, image),
        token=read_text(p["token_file"]),
        gpus=gpus,
        gpu_models=[name for name, _ in found],
        gpu_capabilities=[cap for _, cap in found],
        infiniband_devices=ib,
        ulimits=granted,
    )


if __name__ == "__main__":
    main()
