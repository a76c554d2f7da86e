"""Helpers for the testinfra node checks.

Run as ``pytest tests/infra --hosts=ansible://all --ansible-inventory=<inventory>``.
Every test gets testinfra's ``host``; these helpers read that host's Ansible variables
(rendered by Ansible itself, so templated values such as ``registry_address`` come out
as the roles saw them) and show a service's journal when a service check fails.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import testinfra.utils.ansible_runner

# The role defaults the checks compare against when the inventory does not override them.
ROLE_DEFAULTS: dict[str, Any] = {
    "cluster_domain": "cluster.internal",
    "docker_log_max_size": "100m",
    "docker_log_max_file": 5,
    "docker_live_restore": True,
    "preflight_min_free_gb": 20,
    "preflight_docker_data_root": "/var/lib/docker",
    "registry_username": "ddpfleet",
    "registry_smoke_repository": "ddpfleet/smoke",
    "registry_port": 5000,
    "registry_cert_renew_days": 30,
    "monitoring_prometheus_port": 9090,
    "monitoring_node_exporter_port": 9100,
    "monitoring_retention_time": "15d",
    "monitoring_retention_size": "2GB",
    "slurm_enabled": False,
    "slurm_partition": "ddpfleet",
    "slurm_slurmctld_port": 6817,
}

_RENDERED: dict[tuple[str, str], Any] = {}


def _inventory(config: pytest.Config) -> str:
    inventory = config.getoption("ansible_inventory", None)
    if not inventory:
        raise pytest.UsageError("tests/infra needs --ansible-inventory=<inventory>")
    return str(inventory)


def inventory_hosts(config: pytest.Config) -> list[str]:
    """Every host of the inventory, as Ansible lists it."""
    runner = testinfra.utils.ansible_runner.AnsibleRunner(_inventory(config))
    return sorted(runner.get_hosts("all"))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``peer`` parametrizes a test over every inventory host (for 'resolves every node')."""
    if "peer" in metafunc.fixturenames:
        metafunc.parametrize("peer", inventory_hosts(metafunc.config))


@pytest.fixture
def inventory_vars(host: Any) -> dict[str, Any]:
    """The host's raw inventory variables plus ``groups`` and ``group_names``."""
    return host.ansible.get_variables()


@pytest.fixture
def ansible_var(host: Any, inventory_vars: dict[str, Any]) -> Callable[[str], Any]:
    """``ansible_var(name)``: the variable's value for this host.

    Plain inventory values are used as they are; templated ones (``registry_address``,
    ``ddpfleet_secrets_dir``) are rendered by Ansible itself; role defaults the
    inventory leaves alone come from ROLE_DEFAULTS.
    """
    name_of_host = inventory_vars["inventory_hostname"]

    def get(name: str) -> Any:
        if name not in inventory_vars:
            if name not in ROLE_DEFAULTS:
                raise KeyError(f"{name_of_host}: variable {name} is not defined")
            return ROLE_DEFAULTS[name]
        raw = inventory_vars[name]
        if not (isinstance(raw, str) and "{{" in raw):
            return raw
        key = (name_of_host, name)
        if key not in _RENDERED:
            _RENDERED[key] = host.ansible("ansible.builtin.debug", f"var={name}", check=False)[name]
        return _RENDERED[key]

    return get


@pytest.fixture
def in_group(inventory_vars: dict[str, Any]) -> Callable[[str], bool]:
    """``in_group('registry')``: is this host a member of the group?"""
    return lambda group: group in inventory_vars["group_names"]


@pytest.fixture
def registry_address(ansible_var: Callable[[str], Any]) -> str:
    return str(ansible_var("registry_address"))


@pytest.fixture
def secrets_dir(ansible_var: Callable[[str], Any]) -> Path:
    """ddpfleet_secrets_dir on the controller (where these tests run)."""
    return Path(str(ansible_var("ddpfleet_secrets_dir")))


@pytest.fixture
def gpu_count(host: Any) -> int:
    """GPUs nvidia-smi sees on the host (0 without nvidia-smi), like preflight."""
    if not host.exists("nvidia-smi"):
        return 0
    out = host.check_output("nvidia-smi --query-gpu=name --format=csv,noheader")
    return len([line for line in out.splitlines() if line.strip()])


@pytest.fixture
def requires_gpu(gpu_count: int, inventory_vars: dict[str, Any]) -> int:
    if gpu_count == 0:
        pytest.skip(f"{inventory_vars['inventory_hostname']} has no NVIDIA GPU")
    return gpu_count


@pytest.fixture
def daemon_json(host: Any) -> dict[str, Any]:
    return json.loads(host.file("/etc/docker/daemon.json").content_string)


@pytest.fixture
def assert_service(host: Any) -> Callable[[str], None]:
    """Assert a systemd service is enabled and running; on failure show its journal."""

    def check(name: str) -> None:
        service = host.service(name)
        if not service.is_running:
            journal = host.run(f"journalctl -u {shlex.quote(name)} -n 30 --no-pager").stdout
            pytest.fail(f"{name} is not running; its journal:\n{journal}", pytrace=False)
        assert service.is_enabled, f"{name} is not enabled"

    return check
