"""Checks made before the sandbox creates anything: each failure is one line."""

from __future__ import annotations

import ipaddress
import json
import shutil
from pathlib import Path

from sandbox.dockercli import LABEL, SandboxError, docker, inspect, run
from sandbox.settings import NETWORK, Settings

# Disk the full cluster needs once site.yml has been through it, measured on a 3-node
# sandbox (docker system df -v, docker ps -s): every node holds the training image it
# pulled (6.0 GB) plus the packages site.yml installs (0.7 GB); the registry node also
# held the builder stage, the build context and the registry's storage (12.1 GB more). Since
# the image is built without those two (2026-11-26) that is ~8 GB too much: the registry's
# storage measured 3.1 GB; the figure stays until a full re-measure.
NODE_GB = 7.0
REGISTRY_EXTRA_GB = 12.5
NODE_IMAGE_GB = 0.3
# Host caches under .cache/, needed only while missing: wheelhouse, rootfs tarballs + images.
WHEELHOUSE_GB = 3.0
IMAGE_CACHE_GB = 1.0


def needed_gb(node_count: int) -> float:
    """Free disk under the Docker root the nodes need, in GB."""
    return NODE_IMAGE_GB + NODE_GB * node_count + REGISTRY_EXTRA_GB


def _free(path: Path) -> tuple[float, int]:
    """Free GB and device of the filesystem holding ``path`` (or its nearest parent)."""
    while not path.exists():
        path = path.parent
    return shutil.disk_usage(path).free / 1e9, path.stat().st_dev


def check_disk(settings: Settings, wheelhouse_cached: bool, images_cached: bool) -> None:
    root = Path(docker("info", "--format", "{{.DockerRootDir}}") or "/var/lib/docker")
    cache_need = (0.0 if wheelhouse_cached else WHEELHOUSE_GB) + (
        0.0 if images_cached else IMAGE_CACHE_GB
    )
    needs = {root: needed_gb(settings.node_count), settings.cache: cache_need}
    (root_free, root_dev), (cache_free, cache_dev) = _free(root), _free(settings.cache)
    if root_dev == cache_dev:  # one filesystem: both needs together
        needs = {root: needs[root] + cache_need}
    for path, need in needs.items():
        free = root_free if path == root else cache_free
        if free < need:
            raise SandboxError(
                f"too little free disk for a {settings.node_count}-node sandbox: {need:.1f} GB "
                f"needed under {path}, {free:.1f} GB free"
            )


Found = list[tuple[str, ipaddress.IPv4Network | ipaddress.IPv6Network]]


def _docker_subnets() -> Found:
    found = []
    for net_id in docker("network", "ls", "--quiet").split():
        info = inspect("network", net_id)
        if info is None or info["Name"] == NETWORK:
            continue
        for cfg in (info.get("IPAM") or {}).get("Config") or []:
            if cfg.get("Subnet"):
                found.append((info["Name"], ipaddress.ip_network(cfg["Subnet"], strict=False)))
    return found


def _host_networks(own_bridge: str | None) -> Found:
    """Addresses on host interfaces and routed prefixes (not the default route, nor ours)."""
    found = []
    proc = run(["ip", "-json", "address", "show"], check=False)
    for link in json.loads(proc.stdout or "[]"):
        if link.get("ifname") == own_bridge:
            continue
        for addr in link.get("addr_info", []):
            if addr.get("family") == "inet":
                net = ipaddress.ip_network(f"{addr['local']}/32")
                found.append((f"address {addr['local']} on {link['ifname']}", net))
    proc = run(["ip", "-json", "route", "show"], check=False)
    for route in json.loads(proc.stdout or "[]"):
        if route.get("dst") not in (None, "default") and route.get("dev") != own_bridge:
            net = ipaddress.ip_network(route["dst"], strict=False)
            found.append((f"route {route['dst']} via {route.get('dev', '?')}", net))
    for line in Path("/etc/resolv.conf").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver" and ":" not in parts[1]:
            found.append((f"resolver {parts[1]}", ipaddress.ip_network(f"{parts[1]}/32")))
    return found


def own_bridge() -> str | None:
    """The host interface of the sandbox network, when it exists."""
    info = inspect("network", NETWORK)
    if info is None:
        return None
    options = info.get("Options") or {}
    return options.get("com.docker.network.bridge.name") or f"br-{info['Id'][:12]}"


def check_addresses(settings: Settings) -> None:
    """Fail when the sandbox subnet overlaps another docker network or a host address/route.

    The sandbox's own network and bridge are left out, so re-running ``up`` passes.
    """
    for name, net in _docker_subnets():
        if net.version == 4 and net.overlaps(settings.subnet):
            raise SandboxError(
                f"address range {settings.subnet} already in use by docker network "
                f"{name!r} ({net}); choose another with --subnet or SANDBOX_SUBNET"
            )
    for what, net in _host_networks(own_bridge()):
        if net.version == 4 and net.overlaps(settings.subnet):
            raise SandboxError(
                f"address range {settings.subnet} already in use on this host ({what}); "
                "choose another with --subnet or SANDBOX_SUBNET"
            )


def existing_network(settings: Settings) -> bool:
    """True when the sandbox network exists with the requested subnet (ours, reusable)."""
    info = inspect("network", NETWORK)
    if info is None:
        return False
    if (info.get("Labels") or {}).get(LABEL) != "1":
        raise SandboxError(
            f"a docker network named {NETWORK!r} exists but was not made by the sandbox"
        )
    subnets = [c.get("Subnet") for c in (info.get("IPAM") or {}).get("Config") or []]
    if str(settings.subnet) not in subnets:
        raise SandboxError(
            f"the sandbox already runs on {', '.join(map(str, subnets))}, not {settings.subnet}; "
            "run 'python -m sandbox down' first"
        )
    return True
