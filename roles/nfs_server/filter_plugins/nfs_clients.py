"""Who may mount the export: ``ddpfleet_nfs_client_problems`` names every entry of
``nfs_server_clients`` that is not an IPv4 address or network, or that reaches further than
a /``min_prefix`` network (default /8), so preflight can refuse the list in one line.
Standard library only (no netaddr)."""

from __future__ import annotations

import ipaddress
from typing import Any

MIN_PREFIX = 8


def nfs_client_problems(clients: Any, min_prefix: int = MIN_PREFIX) -> list[str]:
    """One message per bad entry; ``[]`` when every entry is acceptable."""
    if isinstance(clients, str) or not isinstance(clients, (list, tuple)):
        return [f"nfs_server_clients must be a list, not {type(clients).__name__}"]
    if not clients:
        return ["nfs_server_clients is empty: nobody could mount the export"]
    problems = []
    for client in clients:
        text = str(client).strip()
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            problems.append(f"{text!r} is not an IPv4 address or network")
            continue
        if network.version != 4:
            problems.append(f"{text!r} is not IPv4")
        elif network.prefixlen < int(min_prefix):
            problems.append(f"{text} is wider than /{int(min_prefix)}")
        elif network.network_address == ipaddress.IPv4Address("0.0.0.0"):
            problems.append(f"{text} is the unspecified address")
    return problems


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"ddpfleet_nfs_client_problems": nfs_client_problems}
