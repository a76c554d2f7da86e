"""/etc/hosts: a managed block, no 127.0.1.1 hostname line, every node resolves every node."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

BEGIN = "# BEGIN ddpfleet managed block: cluster nodes"
END = "# END ddpfleet managed block: cluster nodes"


@pytest.mark.parametrize("marker", [BEGIN, END])
def test_managed_block_marker_appears_once(host: Any, marker: str) -> None:
    lines = host.file("/etc/hosts").content_string.splitlines()
    assert lines.count(marker) == 1


def test_no_loopback_hostname_line(host: Any) -> None:
    lines = host.file("/etc/hosts").content_string.splitlines()
    assert not [line for line in lines if line.split()[:1] == ["127.0.1.1"]]


def test_own_hostname_resolves_to_cluster_ip(host: Any, inventory_vars: dict[str, Any]) -> None:
    answer = host.check_output("getent hosts $(hostname)").split()
    assert answer[0] == inventory_vars["cluster_ip"]


@pytest.mark.parametrize("form", ["short", "fqdn"])
def test_resolves_every_node(
    host: Any, peer: str, form: str, ansible_var: Callable[[str], Any]
) -> None:
    peer_vars = host.backend.ansible_runner.get_variables(peer)
    name = peer_vars.get("node_hostname", peer)
    if form == "fqdn":
        name = f"{name}.{ansible_var('cluster_domain')}"
    answer = host.check_output("getent hosts %s", name).split()
    assert answer[0] == peer_vars["cluster_ip"]
