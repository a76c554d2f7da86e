"""Node checks for shared storage (roles nfs_server, nfs_client), run on every host:

    pytest tests/infra --hosts=ansible://all --ansible-inventory=<inventory>

Each test holds on every host: the NFS server exports the directory to the cluster only with
root_squash and nobody else serves NFS; every trainer sees the shared directories, owned by
the service uid, writable by it, shared with the server and the other nodes, and closed to root.
"""

from __future__ import annotations

import ipaddress
import secrets
import shlex
from collections.abc import Callable
from typing import Any

import pytest
import testinfra

# Role defaults (roles/nfs_server, roles/nfs_client); the inventory may override each one.
DEFAULTS: dict[str, Any] = {
    "nfs_implementation": "kernel",
    "nfs_export_dir": "/srv/ddpfleet",
    "nfs_owner_name": "ddpfleet",
    "nfs_owner_uid": 2000,
    "nfs_owner_gid": 2000,
    "nfs_client_mode": "mount",
    "shared_mount": "/mnt/ddpfleet",
}
SERVICES = {"kernel": "nfs-server", "ganesha": "nfs-ganesha"}
SUBDIRS = ("datasets", "runs", "doctor")
PROBE = "/usr/local/sbin/ddpfleet-nfs-probe"
SETGID_2775 = 0o2775


@pytest.fixture
def cfg(inventory_vars: dict[str, Any], in_group: Callable[[str], bool]) -> dict[str, Any]:
    """This host's NFS settings as the roles saw them (inventory, else the roles' defaults)."""
    # These settings are plain values in the inventory (no templates): read them raw.
    found = {key: inventory_vars.get(key, default) for key, default in DEFAULTS.items()}
    for key in ("nfs_owner_uid", "nfs_owner_gid"):
        found[key] = int(found[key])
    found["cluster_cidr"] = inventory_vars["cluster_cidr"]
    found["inventory_hostname"] = inventory_vars["inventory_hostname"]
    found["groups"] = inventory_vars["groups"]
    found["server"] = inventory_vars["groups"]["nfs_server"][0]
    found["is_server"] = in_group("nfs_server")
    found["is_trainer"] = in_group("trainers")
    return found


def needs_storage(cfg: dict[str, Any]) -> None:
    """Shared storage is promised on the NFS server and the trainers only."""
    if not (cfg["is_server"] or cfg["is_trainer"]):
        pytest.skip(f"{cfg['inventory_hostname']} is neither the NFS server nor a trainer")


def other_host(host: Any, name: str) -> Any:
    """Another host of the same inventory."""
    return testinfra.get_host(f"ansible://{name}", ansible_inventory=host.backend.ansible_inventory)


def server_ip(host: Any, cfg: dict[str, Any]) -> str:
    return other_host(host, cfg["server"]).ansible.get_variables()["cluster_ip"]


def as_owner(cfg: dict[str, Any], command: str) -> str:
    uid, gid = cfg["nfs_owner_uid"], cfg["nfs_owner_gid"]
    return f"setpriv --reuid={uid} --regid={gid} --clear-groups -- sh -c {shlex.quote(command)}"


def test_only_the_nfs_server_runs_an_nfs_service(
    host: Any, cfg: dict[str, Any], assert_service: Callable[[str], None]
) -> None:
    unit = SERVICES[cfg["nfs_implementation"]]
    if cfg["is_server"]:
        assert_service(unit)
    else:
        assert not host.service(unit).is_running, f"{unit} runs on {cfg['inventory_hostname']}"


def test_only_the_nfs_server_listens_on_2049(host: Any, cfg: dict[str, Any]) -> None:
    listening = any(
        socket.endswith(":2049")
        for socket in host.socket.get_listening_sockets()
        if "tcp" in socket
    )
    assert listening == cfg["is_server"], (
        f"port 2049 {'not ' if cfg['is_server'] else ''}listening on {cfg['inventory_hostname']}"
    )


def test_export_goes_to_the_cluster_only_with_root_squash(host: Any, cfg: dict[str, Any]) -> None:
    if not cfg["is_server"]:
        assert not host.file("/etc/exports.d/ddpfleet.exports").exists
        return
    if cfg["nfs_implementation"] == "ganesha":
        conf = host.file("/etc/ganesha/ganesha.conf")
        assert (conf.user, conf.group, conf.mode) == ("root", "root", 0o644)
        text = conf.content_string
        expected = [
            f"Path = {cfg['nfs_export_dir']};",
            "Protocols = 4;",
            "Squash = root_squash;",
            "Access_Type = RW;",
            "Access_Type = None;",
        ]
        missing = [line for line in expected if line not in text]
        assert not missing, f"ganesha.conf lacks {missing}"
        assert "no_root_squash" not in text
        assert "Clients = *" not in text
    else:
        exports = host.run("exportfs -v")
        assert exports.rc == 0, exports.stderr
        line = next(ln for ln in exports.stdout.split("\n\n") if cfg["nfs_export_dir"] in ln)
        assert "root_squash" in line
        assert "no_root_squash" not in line


def export_clients(host: Any, cfg: dict[str, Any]) -> list[str]:
    """The clients the running configuration lets mount the export."""
    if cfg["nfs_implementation"] == "ganesha":
        text = host.file("/etc/ganesha/ganesha.conf").content_string
        lines = [ln.strip() for ln in text.splitlines() if ln.strip().startswith("Clients =")]
        return [c.strip() for ln in lines for c in ln.split("=", 1)[1].rstrip(";").split(",")]
    exports = host.run("exportfs -s")
    assert exports.rc == 0, exports.stderr
    line = next(ln for ln in exports.stdout.splitlines() if ln.startswith(cfg["nfs_export_dir"]))
    return [entry.split("(")[0] for entry in line.split()[1:]]


def test_export_clients_are_no_wider_than_a_slash_8(host: Any, cfg: dict[str, Any]) -> None:
    if not cfg["is_server"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not the NFS server")
    clients = export_clients(host, cfg)
    assert clients, "the export lists no clients"
    wide = [c for c in clients if ipaddress.ip_network(c, strict=False).prefixlen < 8]
    assert not wide, f"clients wider than /8: {wide}"
    assert "*" not in clients


def test_export_clients_default_to_the_trainers_addresses(
    host: Any, cfg: dict[str, Any], inventory_vars: dict[str, Any]
) -> None:
    if not cfg["is_server"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not the NFS server")
    if "nfs_server_clients" in inventory_vars:
        pytest.skip("the inventory sets nfs_server_clients itself")
    trainers = [
        other_host(host, name).ansible.get_variables()["cluster_ip"]
        for name in cfg["groups"]["trainers"]
    ]
    assert sorted(export_clients(host, cfg)) == sorted(trainers)


def test_export_requires_privileged_source_ports(host: Any, cfg: dict[str, Any]) -> None:
    """Only root on a client (a port below 1024) may speak NFS to the server."""
    if not cfg["is_server"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not the NFS server")
    if cfg["nfs_implementation"] == "ganesha":
        text = host.file("/etc/ganesha/ganesha.conf").content_string
        export = text.split("\nEXPORT {", 1)[1]
        assert "PrivilegedPort = true;" in export
        assert "PrivilegedPort = false" not in text
    else:
        exports = host.run("exportfs -v")
        assert exports.rc == 0, exports.stderr
        assert "insecure" not in exports.stdout
        assert "secure" in exports.stdout


@pytest.mark.parametrize("subdir", SUBDIRS)
def test_export_subdirs_belong_to_the_service_uid(
    host: Any, cfg: dict[str, Any], subdir: str
) -> None:
    base = cfg["nfs_export_dir"] if cfg["is_server"] else cfg["shared_mount"]
    needs_storage(cfg)
    directory = host.file(f"{base}/{subdir}")
    assert directory.is_directory
    assert (directory.uid, directory.gid) == (cfg["nfs_owner_uid"], cfg["nfs_owner_gid"])
    assert directory.mode == SETGID_2775, oct(directory.mode)


def test_export_root_is_not_world_writable(host: Any, cfg: dict[str, Any]) -> None:
    needs_storage(cfg)
    path = cfg["nfs_export_dir"] if cfg["is_server"] else cfg["shared_mount"]
    root = host.file(path)
    assert root.is_directory
    assert root.mode & 0o002 == 0, f"{path} is world-writable ({oct(root.mode)})"
    assert root.user == "root"


def test_service_user_exists(host: Any, cfg: dict[str, Any]) -> None:
    needs_storage(cfg)
    user = host.user(cfg["nfs_owner_name"])
    assert user.exists
    assert (user.uid, user.gid) == (cfg["nfs_owner_uid"], cfg["nfs_owner_gid"])
    assert user.shell.endswith("nologin")


def test_shared_mount_is_mounted_as_configured(host: Any, cfg: dict[str, Any]) -> None:
    if not cfg["is_trainer"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not a trainer (nfs_client runs on trainers)")
    mount = cfg["shared_mount"]
    assert host.mount_point(mount).exists, f"{mount} is not a mount point"
    if cfg["nfs_client_mode"] != "mount":
        return  # shared_volume: the sandbox mounted one docker volume on every node
    fstab = host.file("/etc/fstab").content_string
    entry = next((ln.split() for ln in fstab.splitlines() if f" {mount} " in f" {ln} "), None)
    assert entry is not None, f"no /etc/fstab entry for {mount}"
    if cfg["is_server"]:
        assert entry[0] == cfg["nfs_export_dir"]
        assert "bind" in entry[3].split(",")
    else:
        assert entry[2] == "nfs4"
        assert {"_netdev", "nofail", "hard"} <= set(entry[3].split(","))
        assert host.mount_point(mount).filesystem == "nfs4"


def test_shared_dir_is_writable_by_the_service_uid_and_shared(
    host: Any, cfg: dict[str, Any]
) -> None:
    """A file written here as the service uid is read on the server's disk and on the next node."""
    if not cfg["is_trainer"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not a trainer (nfs_client runs on trainers)")
    name = f".infra-probe-{cfg['inventory_hostname']}-{secrets.token_hex(4)}"
    token = secrets.token_hex(8)
    path = f"{cfg['shared_mount']}/runs/{name}"
    write = host.run(as_owner(cfg, f"umask 022; printf %s {token} > {path}"))
    assert write.rc == 0, write.stderr
    try:
        server = other_host(host, cfg["server"])
        on_server = server.file(f"{cfg['nfs_export_dir']}/runs/{name}")
        assert on_server.content_string == token
        assert on_server.uid == cfg["nfs_owner_uid"]
        trainers = cfg["groups"]["trainers"]
        neighbour = trainers[(trainers.index(cfg["inventory_hostname"]) + 1) % len(trainers)]
        assert other_host(host, neighbour).file(path).content_string == token
    finally:
        host.run(as_owner(cfg, f"rm -f {path}"))


def test_nfs_protocol_serves_the_shared_files(host: Any, cfg: dict[str, Any]) -> None:
    """Through NFSv4 itself: a file in the shared mount reads back from the server."""
    if not cfg["is_trainer"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not a trainer (nfs_client runs on trainers)")
    name = f".infra-nfs-{cfg['inventory_hostname']}-{secrets.token_hex(4)}"
    token = secrets.token_hex(8)
    path = f"{cfg['shared_mount']}/runs/{name}"
    assert host.run(as_owner(cfg, f"printf %s {token} > {path}")).rc == 0
    try:
        if cfg["nfs_client_mode"] == "shared_volume":
            url = f"nfs://{server_ip(host, cfg)}{cfg['nfs_export_dir']}/runs/{name}"
            ids = f"-u {cfg['nfs_owner_uid']} -g {cfg['nfs_owner_gid']}"
            read = host.run(f"{PROBE} {ids} read {shlex.quote(url)}")
        else:
            read = host.run(as_owner(cfg, f"cat {path}"))
        assert read.rc == 0, read.stderr
        assert read.stdout.strip() == token
    finally:
        host.run(as_owner(cfg, f"rm -f {path}"))


def test_root_is_squashed(host: Any, cfg: dict[str, Any]) -> None:
    if not cfg["is_trainer"]:
        pytest.skip(f"{cfg['inventory_hostname']} is not a trainer (nfs_client runs on trainers)")
    probe = host.file(PROBE)
    assert (probe.user, probe.mode) == ("root", 0o755)
    if cfg["nfs_client_mode"] == "shared_volume":
        target = f"nfs://{server_ip(host, cfg)}{cfg['nfs_export_dir']}/runs/.infra-root-probe"
    elif cfg["is_server"]:
        # Root on the server owns the disk and reaches the export by a bind mount, not NFS:
        # what protects the other nodes is the export option.
        exports = host.run("exportfs -v")
        assert exports.rc == 0, exports.stderr
        assert "root_squash" in exports.stdout
        assert "no_root_squash" not in exports.stdout
        return
    else:
        target = f"{cfg['shared_mount']}/runs/.infra-root-probe"
    denied = host.run(f"{PROBE} root-denied {shlex.quote(target)}")
    assert denied.rc == 0, denied.stderr
    assert "root_squash enforced" in denied.stdout
