"""``provisioned``: site.yml applied to the sandbox once per test session.

The lead imports this module's fixture into tests/e2e/conftest.py (which owns the
``sandbox`` fixture); every e2e test that needs a provisioned cluster asks for
``provisioned``. ``run_site`` and ``parse_recap`` are shared with test_20_site.py.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pytest

RECAP_LINE = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+"
    r"unreachable=(?P<unreachable>\d+)\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)"
    r"\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.MULTILINE,
)


@dataclass(frozen=True)
class PlaybookRun:
    """One ansible-playbook run: exit code, output, wall time and the PLAY RECAP."""

    args: tuple[str, ...]
    rc: int
    stdout: str
    stderr: str
    wall_s: float
    recap: dict[str, dict[str, int]]

    def tail(self, lines: int = 60) -> str:
        return "\n".join((self.stdout + self.stderr).splitlines()[-lines:])

    def changed_hosts(self) -> dict[str, int]:
        return {host: c["changed"] for host, c in self.recap.items() if c["changed"]}


def parse_recap(stdout: str) -> dict[str, dict[str, int]]:
    """Per-host counters of the PLAY RECAP (last one wins if several)."""
    recap: dict[str, dict[str, int]] = {}
    section = stdout.rsplit("PLAY RECAP", 1)[-1] if "PLAY RECAP" in stdout else ""
    for match in RECAP_LINE.finditer(section):
        counts = match.groupdict()
        host = counts.pop("host")
        recap[host] = {key: int(value) for key, value in counts.items()}
    return recap


def run_site(sandbox: Any, *args: str, playbook: str = "site.yml") -> PlaybookRun:
    """Run ``ansible-playbook -i <sandbox inventory> site.yml ARGS`` and time it."""
    start = time.monotonic()
    proc = sandbox.playbook(playbook, *args)
    wall = time.monotonic() - start
    return PlaybookRun(
        args=(playbook, *args),
        rc=proc.returncode,
        stdout=proc.stdout,
        stderr=proc.stderr,
        wall_s=round(wall, 1),
        recap=parse_recap(proc.stdout),
    )


# The first site.yml's slowest tasks (ansible.cfg's profile_tasks recap), for the tier's
# closing summary: where the longest step of CI goes.
FIRST_SITE_SLOWEST: list[str] = []

# The tier's headline figures ("site.yml no-op re-run: 31.2 s, rc 0"), printed in its closing
# summary: pytest captures a passing test's prints, so CI's log would not show them otherwise.
FIGURES: list[str] = []


def task_started(out: str, task: str) -> float | None:
    """When ansible-playbook started ``task`` (profile_tasks' line under its banner, the
    controller's clock), or None."""
    found = re.search(
        rf"TASK \[[^]]*{re.escape(task)}\][^\n]*\n(\w+ \d+ \w+ \d+ +[\d:]+ [+-]\d+)", out
    )
    if found is None:
        return None
    return datetime.strptime(" ".join(found[1].split()), "%A %d %B %Y %H:%M:%S %z").timestamp()


def figure(line: str) -> None:
    """Keep ``line`` for the e2e tier's summary (and print it, for a run with ``-s``)."""
    FIGURES.append(line)
    print(f"\n{line}")


def cpu_reference_s(steps: int = 10_000_000) -> float:
    """Seconds a fixed pure-Python loop takes on the controller now: the baseline a figure of
    the same moment is read against (these VMs' speed changes by a third from minute to
    minute, and by more between CPU kinds)."""
    start, total = time.perf_counter(), 0
    for i in range(steps):
        total += i
    return time.perf_counter() - start


def slowest_tasks(stdout: str, count: int = 15) -> list[str]:
    """The first ``count`` lines of profile_tasks' recap ("role : task ---- 12.34s"). A long
    task name leaves no room for the dashes but two ("... versions) --540.12s")."""
    return [ln.strip() for ln in stdout.splitlines() if re.search(r" -+ ?\d+\.\d+s$", ln)][:count]


@pytest.fixture(scope="session")
def provisioned(sandbox: Any) -> PlaybookRun:
    """site.yml applied once; fails every dependent test with the run's tail if it failed."""
    run = run_site(sandbox)
    FIRST_SITE_SLOWEST[:] = slowest_tasks(run.stdout)
    figure(f"site.yml first run: {run.wall_s:.1f} s, rc {run.rc}")
    if run.rc != 0:
        pytest.fail(f"site.yml failed (rc {run.rc}):\n{run.tail()}", pytrace=False)
    return run
