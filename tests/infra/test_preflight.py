"""What preflight promises about every node: supported OS, names, addresses, disk."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

SUPPORTED = {("debian", "12"), ("ubuntu", "22.04"), ("ubuntu", "24.04")}


def test_os_is_supported(host: Any) -> None:
    info = host.system_info
    release = info.release if info.distribution == "ubuntu" else info.release.split(".")[0]
    assert (info.distribution, release) in SUPPORTED


def test_hostname_matches_inventory(host: Any, inventory_vars: dict[str, Any]) -> None:
    expected = inventory_vars.get("node_hostname", inventory_vars["inventory_hostname"])
    assert host.check_output("hostname --short") == expected


def test_cluster_ip_is_a_local_address(host: Any, inventory_vars: dict[str, Any]) -> None:
    addresses = host.check_output("hostname --all-ip-addresses").split()
    assert inventory_vars["cluster_ip"] in addresses


def test_nic_carries_cluster_ip(host: Any, inventory_vars: dict[str, Any]) -> None:
    nic = inventory_vars.get("nic") or host.check_output(
        "ip -o route get %s | sed -n 's/.* dev \\([^ ]*\\).*/\\1/p'", inventory_vars["cluster_ip"]
    )
    addresses = host.interface(nic).addresses
    assert inventory_vars["cluster_ip"] in addresses


def test_free_disk_for_images(host: Any, ansible_var: Callable[[str], Any]) -> None:
    root = str(ansible_var("preflight_docker_data_root"))
    free_kib = int(host.check_output("df --output=avail -k %s | tail -n 1", root))
    assert free_kib >= int(ansible_var("preflight_min_free_gb")) * 1024 * 1024
