"""The generated inventory: ``inventory/sandbox/`` in the shape of ``inventory/sample/``."""

from __future__ import annotations

import os
from pathlib import Path

from sandbox.settings import (
    IMAGES_MOUNT,
    NFS_EXPORT_DIR,
    SHARED_MOUNT,
    WHEELHOUSE_MOUNT,
    Settings,
)

HEADER = (
    "---\n# Written by 'python -m sandbox up'; removed by 'python -m sandbox down'. Do not edit.\n"
)
OVERRIDES = "zz_sandbox.yml"
LEGACY = ["demo.yml"]  # written by earlier versions; `down` still removes it

# Small training settings so a run ends in minutes on a 2-core machine without GPUs, where
# every node's rank shares the same cores: one thread per rank, no loader processes, a
# small /dev/shm (the nodes' containers live in the host's memory).
DEMO_TRAINING = {
    "train_image_size": "64",
    "train_batch_size": "8",
    "train_max_steps": "30",
    "train_synthetic": "true",
    "train_nproc_per_node": "1",
    "train_workers": "0",
    "train_omp_num_threads": "1",
    "train_shm_size_mb": "256",
}


def hosts_yaml(settings: Settings) -> str:
    lines = [
        HEADER.rstrip("\n"),
        "all:",
        "  vars:",
        f"    ansible_user: {settings.login}",
        # A sudo user, as on real clusters (inventory/sample logs in as ubuntu the same way).
        *(["    ansible_become: true"] if settings.login != "root" else []),
        f"    ansible_ssh_private_key_file: {settings.key_path}",
        # The nodes are throwaway containers with fresh host keys on every `up`, reached on
        # a private Docker network: only this generated inventory skips host-key checks
        # (ansible.cfg keeps them on for every other inventory).
        "    ansible_host_key_checking: false",
        "    ansible_ssh_common_args: >-",
        "      -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR",
        "    ansible_python_interpreter: /usr/bin/python3",
        "  children:",
        "    trainers:",
        "      hosts:",
    ]
    for node in settings.nodes:
        lines += [
            f"        {node.name}:",
            f"          ansible_host: {node.ip}",
            f"          cluster_ip: {node.ip}",
            "          nic: eth0",
            "          gpus: 0",
            f"          node_hostname: {node.container}",
        ]
    first = settings.nodes[0].name
    lines += ["    nfs_server:", "      hosts:", f"        {first}:"]
    lines += ["    registry:", "      hosts:", f"        {first}:"]
    return "\n".join(lines) + "\n"


def overrides_yaml(settings: Settings, mode: str, trainer_base: str, archive: str) -> str:
    values = {
        "cluster_cidr": str(settings.subnet),
        "shared_mount": SHARED_MOUNT,
        "nfs_export_dir": NFS_EXPORT_DIR,
        "nfs_implementation": "ganesha",
        "nfs_client_mode": "shared_volume" if mode == "shared_volume" else "mount",
        "docker_package_source": "distribution",
        "trainer_image_base": trainer_base,
        "trainer_image_base_archive": f"{IMAGES_MOUNT}/{archive}",
        "trainer_image_wheelhouse": WHEELHOUSE_MOUNT,
        "sandbox_storage_mode": mode,
        # Every node's /var/lib/docker is a volume on the host's one disk, which the
        # sandbox's own preflight already sized for the whole cluster; once the training
        # image is on all nodes, the per-node 20 GB default would refuse a re-run.
        "preflight_min_free_gb": "8",
        # The sandbox's runs last a minute or two: scrape often enough to draw them.
        "monitoring_scrape_interval": "5s",
        # Slurm is off by default; the sandbox turns it on, so that site.yml, its no-op re-run
        # and testinfra cover the slurm role on every `make test`.
        "slurm_enabled": "true",
        **DEMO_TRAINING,
    }
    body = "".join(f"{key}: {value}\n" for key, value in values.items())
    return (
        HEADER
        + "# Sandbox overrides of the cluster-wide settings (loaded after the sample's files).\n"
        + body
    )


def written_files(settings: Settings) -> list[Path]:
    """Every inventory file ``write`` produces (what ``down`` removes)."""
    inv = settings.inventory_dir
    sample = settings.root / "inventory" / "sample" / "group_vars" / "all"
    files = [inv / "hosts.yml", inv / "group_vars" / "all" / OVERRIDES]
    files += [inv / name for name in LEGACY]
    files += [inv / "group_vars" / "all" / p.name for p in sorted(sample.glob("*.yml"))]
    return files


def _write(path: Path, text: str) -> None:
    """Replace ``path`` atomically, and only when its content changes (Ansible may be reading)."""
    if path.exists() and path.read_text() == text:
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write(settings: Settings, mode: str, trainer_base: str, archive: str) -> Path:
    """Write the inventory; return the path of hosts.yml."""
    inv = settings.inventory_dir
    group_vars = inv / "group_vars" / "all"
    group_vars.mkdir(parents=True, exist_ok=True)
    sample = settings.root / "inventory" / "sample" / "group_vars" / "all"
    copies = {path.name: path.read_text() for path in sorted(sample.glob("*.yml"))}
    for stale in group_vars.glob("*.yml"):  # a file the sample no longer has
        if stale.name not in copies and stale.name != OVERRIDES:
            stale.unlink()
    for name, text in copies.items():
        _write(group_vars / name, text)
    _write(group_vars / OVERRIDES, overrides_yaml(settings, mode, trainer_base, archive))
    for name in LEGACY:
        (inv / name).unlink(missing_ok=True)
    hosts = inv / "hosts.yml"
    _write(hosts, hosts_yaml(settings))
    return hosts


def remove(settings: Settings) -> list[Path]:
    """Remove the files ``write`` made and the directories left empty; return removed files."""
    removed = [p for p in written_files(settings) if p.exists()]
    for path in removed:
        path.unlink()
    for directory in (
        settings.inventory_dir / "group_vars" / "all",
        settings.inventory_dir / "group_vars",
        settings.inventory_dir,
    ):
        if directory.is_dir() and not any(directory.iterdir()):
            directory.rmdir()
    return removed
