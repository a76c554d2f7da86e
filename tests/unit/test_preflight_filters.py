"""Preflight's stdlib-only address filters."""

from __future__ import annotations

import pytest
from plugin_loader import load_plugin

preflight = load_plugin("ddpfleet_preflight_filters", "roles/preflight/filter_plugins/preflight.py")


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
