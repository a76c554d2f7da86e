"""Small filters for preflight checks, on the standard library only (no netaddr)."""

from __future__ import annotations

import ipaddress
from typing import Any


def ip_in_network(address: Any, cidr: Any) -> bool:
    """True if ``address`` is a valid IP inside network ``cidr``; False otherwise."""
    try:
        network = ipaddress.ip_network(str(cidr), strict=False)
        ip = ipaddress.ip_address(str(address))
    except ValueError:
        return False
    return ip in network


def is_ip_address(address: Any) -> bool:
    """True if ``address`` is a valid IPv4 or IPv6 address (no prefix)."""
    try:
        ipaddress.ip_address(str(address))
    except ValueError:
        return False
    return True


def is_network(cidr: Any) -> bool:
    """True if ``cidr`` is a valid network such as ``10.0.0.0/24`` (host bits allowed)."""
    try:
        ipaddress.ip_network(str(cidr), strict=False)
    except ValueError:
        return False
    return True


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "ddpfleet_ip_in_network": ip_in_network,
            "ddpfleet_is_ip": is_ip_address,
            "ddpfleet_is_network": is_network,
        }
