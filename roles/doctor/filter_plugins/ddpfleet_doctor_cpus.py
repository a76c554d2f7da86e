"""Filter of the doctor role: a check container's CPU quota, in the CFS period and quota a run
container gets for the same train_cpus (ddpfleet_agent.container.cpu_limits, from this
checkout), so the doctor measures a host as its ranks will run there."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # this checkout's packages
from ddpfleet_agent.container import cpu_limits


def cpu_quota(cpus: float) -> dict:
    """{"period": µs, "quota": µs} for train_cpus > 0; {} for none."""
    if float(cpus) <= 0:
        return {}
    period, quota = cpu_limits(float(cpus))
    return {"period": period, "quota": quota}


class FilterModule:
    """ddpfleet doctor filter: a check container's CPU quota."""

    def filters(self) -> dict:
        return {"ddpfleet_doctor_cpu_quota": cpu_quota}
