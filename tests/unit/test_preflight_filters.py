"""Preflight's stdlib-only address and mount filters."""

from __future__ import annotations

import pytest
from plugin_loader import load_plugin

preflight = load_plugin("ddpfleet_preflight_filters", "roles/preflight/filter_plugins/preflight.py")

MOUNTS = [
    {"mount": "/", "size_available": 10},
    {"mount": "/var", "size_available": 20},
    {"mount": "/var/lib/docker", "size_available": 30},
    {"mount": "/var/lib/dockerish", "size_available": 40},
]


@pytest.mark.parametrize(
    ("address", "cidr", "inside"),
    [
        ("10.0.0.11", "10.0.0.0/24", True),
        ("10.0.1.11", "10.0.0.0/24", False),
        ("10.0.0.11", "10.0.0.5/24", True),
        ("192.0.2.1", "192.0.2.0/24", True),
        ("not-an-ip", "10.0.0.0/24", False),
        ("10.0.0.11", "10.0.0.0/33", False),
        ("10.0.0.256", "10.0.0.0/24", False),
        ("fd00::5", "fd00::/64", True),
        ("10.0.0.1", "fd00::/64", False),
    ],
)
def test_ip_in_network(address: str, cidr: str, inside: bool) -> None:
    assert preflight.ip_in_network(address, cidr) is inside


@pytest.mark.parametrize(
    ("address", "valid"),
    [("10.0.0.1", True), ("fd00::1", True), ("10.0.0.1/24", False), ("gpu1", False), ("", False)],
)
def test_is_ip(address: str, valid: bool) -> None:
    assert preflight.is_ip_address(address) is valid


@pytest.mark.parametrize(
    ("cidr", "valid"),
    [("10.0.0.0/24", True), ("10.0.0.7/24", True), ("10.0.0.0/40", False), ("ten/8", False)],
)
def test_is_network(cidr: str, valid: bool) -> None:
    assert preflight.is_network(cidr) is valid


@pytest.mark.parametrize(
    ("path", "mount"),
    [
        ("/var/lib/docker", "/var/lib/docker"),
        ("/var/lib/docker/overlay2", "/var/lib/docker"),
        ("/var/lib/dock", "/var"),
        ("/var/lib/dockerish/x", "/var/lib/dockerish"),
        ("/srv/images", "/"),
        ("/var/lib/docker/", "/var/lib/docker"),
    ],
)
def test_mount_for_path_picks_the_longest_parent(path: str, mount: str) -> None:
    assert preflight.mount_for_path(path, MOUNTS)["mount"] == mount


def test_mount_for_path_without_a_match_is_empty() -> None:
    assert preflight.mount_for_path("/data", [{"mount": "/boot"}]) == {}
