"""The CPUs a container may use beyond its affinity mask: its cgroup CPU quota.

Standard library only: the trainer's loader (trainer.decode.loader_cores) sizes its workers
with it, and the doctor's compute check (ddpfleet_doctor.compute) reports it, without torch.
"""

from __future__ import annotations

from pathlib import Path


def cpu_quota(root: str = "/sys/fs/cgroup") -> float | None:
    """The container's CPU quota in cores (quota / CFS period: train_cpus), None when unlimited
    or unknown."""
    base = Path(root)
    try:
        quota, period = (base / "cpu.max").read_text().split()[:2]  # cgroup v2
        return None if quota == "max" else int(quota) / int(period)
    except (OSError, ValueError):
        pass
    try:  # cgroup v1
        quota = int((base / "cpu" / "cpu.cfs_quota_us").read_text())
        period = int((base / "cpu" / "cpu.cfs_period_us").read_text())
        return None if quota <= 0 else quota / period
    except (OSError, ValueError):
        return None
