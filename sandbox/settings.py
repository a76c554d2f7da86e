"""What the sandbox is made of: node count, addresses, names and paths."""

from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from sandbox.dockercli import SandboxError

DEFAULT_SUBNET = "10.213.97.0/24"
DEFAULT_NODES = 3
MAX_NODES = 9
FIRST_HOST = 11
"""node1 gets .11, node2 .12, … (the gateway is .1)."""
NETWORK = "ddpfleet-sandbox"
SHARED_VOLUME = "ddpfleet-sandbox-shared"
SHARED_MOUNT = "/mnt/ddpfleet"
NFS_EXPORT_DIR = "/srv/ddpfleet"
IMAGES_MOUNT = "/opt/ddpfleet/images"
WHEELHOUSE_MOUNT = "/opt/ddpfleet/wheelhouse"
REPO_ROOT = Path(__file__).resolve().parent.parent
LOGINS = ("ops", "root")
"""Who Ansible logs in as: ``ops``, a sudo user as on real clusters (the default), or root."""


@dataclass(frozen=True)
class Node:
    """One node container; ``name`` is its inventory hostname."""

    index: int
    ip: str

    @property
    def name(self) -> str:
        return f"node{self.index}"

    @property
    def container(self) -> str:
        """Container name, which is also the node's hostname."""
        return f"ddpfleet-node{self.index}"

    @property
    def docker_volume(self) -> str:
        return f"ddpfleet-sandbox-{self.name}-docker"


@dataclass(frozen=True)
class Settings:
    subnet: ipaddress.IPv4Network
    node_count: int
    root: Path = REPO_ROOT
    login: str = LOGINS[0]

    @property
    def gateway(self) -> str:
        return str(self.subnet.network_address + 1)

    @property
    def nodes(self) -> list[Node]:
        base = self.subnet.network_address + FIRST_HOST
        return [Node(i, str(base + i - 1)) for i in range(1, self.node_count + 1)]

    @property
    def inventory_dir(self) -> Path:
        return self.root / "inventory" / "sandbox"

    @property
    def key_path(self) -> Path:
        return self.inventory_dir / "id_ed25519"

    @property
    def cache(self) -> Path:
        return self.root / ".cache" / "sandbox"

    @property
    def wheelhouse(self) -> Path:
        return self.root / ".cache" / "wheelhouse"


def parse_subnet(text: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        raise SandboxError(f"subnet {text!r} is not an IPv4 network in CIDR form: {exc}") from exc
    if not isinstance(net, ipaddress.IPv4Network):
        raise SandboxError(f"subnet {text!r} must be IPv4")
    if not net.is_private:
        raise SandboxError(f"subnet {text} is not a private address range")
    return net


def make_settings(
    subnet: str | None, nodes: int | str | None, login: str | None = None
) -> Settings:
    """Settings from CLI values, falling back to SANDBOX_SUBNET / SANDBOX_NODES /
    SANDBOX_LOGIN and defaults."""
    login = login or os.environ.get("SANDBOX_LOGIN") or LOGINS[0]
    if login not in LOGINS:
        raise SandboxError(f"login must be one of {', '.join(LOGINS)}, got {login!r}")
    subnet_text = subnet or os.environ.get("SANDBOX_SUBNET") or DEFAULT_SUBNET
    raw_nodes = nodes if nodes is not None else os.environ.get("SANDBOX_NODES", DEFAULT_NODES)
    try:
        count = int(raw_nodes)
    except ValueError:
        raise SandboxError(f"node count {raw_nodes!r} is not a whole number") from None
    if not 1 <= count <= MAX_NODES:
        raise SandboxError(f"node count must be between 1 and {MAX_NODES}, got {count}")
    net = parse_subnet(subnet_text)
    needed = FIRST_HOST + count
    if net.num_addresses < needed + 1:
        raise SandboxError(
            f"subnet {net} is too small for {count} nodes at .{FIRST_HOST}+ (use /27 or larger)"
        )
    return Settings(subnet=net, node_count=count, login=login)
