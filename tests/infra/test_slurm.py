"""Slurm (slurm_enabled): munge with the controller's key on every node, slurmctld on the
registry host, slurmd on every trainer, and every trainer idle in the partition."""

from __future__ import annotations

import hashlib
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(autouse=True)
def slurm_enabled(
    ansible_var: Callable[[str], Any], in_group: Callable[[str], bool], inventory_vars: dict
) -> None:
    if str(ansible_var("slurm_enabled")).lower() != "true":
        pytest.skip("slurm_enabled is off")
    if not (in_group("registry") or in_group("trainers")):
        pytest.skip(f"{inventory_vars['inventory_hostname']} is neither registry nor trainer")


def test_munge_runs_with_the_cluster_key(
    host: Any, assert_service: Callable[[str], None], secrets_dir: Path
) -> None:
    assert_service("munge")
    key = host.file("/etc/munge/munge.key")
    assert (key.user, key.group, key.mode) == ("munge", "munge", 0o400)
    with host.sudo():
        installed = host.check_output("sha256sum /etc/munge/munge.key").split()[0]
    source = secrets_dir / "munge.key"
    assert installed == hashlib.sha256(source.read_bytes()).hexdigest()
    assert stat.S_IMODE(source.stat().st_mode) == 0o600  # on the controller


def test_a_munge_credential_decodes(host: Any) -> None:
    decoded = host.run("munge -n | unmunge")
    assert decoded.rc == 0, decoded.stderr
    assert "STATUS:          Success (0)" in decoded.stdout, decoded.stdout


def test_slurmctld_runs_on_the_registry_host(
    host: Any,
    in_group: Callable[[str], bool],
    assert_service: Callable[[str], None],
    ansible_var: Callable[[str], Any],
) -> None:
    if not in_group("registry"):
        pytest.skip("slurmctld runs on the registry host")
    assert_service("slurmctld")
    assert host.socket(f"tcp://0.0.0.0:{ansible_var('slurm_slurmctld_port')}").is_listening


def test_slurmd_runs_on_every_trainer(
    host: Any, in_group: Callable[[str], bool], assert_service: Callable[[str], None]
) -> None:
    if not in_group("trainers"):
        pytest.skip("slurmd runs on the trainers")
    assert_service("slurmd")


def test_every_trainer_is_idle_in_the_partition(
    host: Any,
    in_group: Callable[[str], bool],
    inventory_vars: dict,
    ansible_var: Callable[[str], Any],
) -> None:
    if not in_group("registry"):
        pytest.skip("asked on the registry host")
    runner = host.backend.ansible_runner
    trainers = inventory_vars["groups"]["trainers"]
    expected = {runner.get_variables(t).get("node_hostname", t): "idle" for t in trainers}
    partition = ansible_var("slurm_partition")
    command = f"sinfo --noheader --Node --partition {partition} --format '%N %t'"
    seen: dict[str, str] = {}
    for _ in range(15):  # a slurmd restarted by site.yml registers within seconds
        seen = dict(line.split() for line in host.check_output(command).splitlines())
        if seen == expected:
            break
        time.sleep(2)
    assert seen == expected
