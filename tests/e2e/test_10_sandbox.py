"""The sandbox cluster itself: fresh nodes that Ansible reaches like servers.

Runs first among the e2e modules (file order), before site.yml changes the nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT, SSH_OPTIONS, Sandbox, SandboxNode, docker_names, sandbox_cli

from sandbox.settings import make_settings

NODE_NAMES = [node.name for node in make_settings(None, None).nodes]
LABEL_FILTER = "label=io.ddpfleet.sandbox=1"


def _node(sandbox: Sandbox, name: str) -> SandboxNode:
    return sandbox.node(name)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _require_fresh(sandbox: Sandbox, node: SandboxNode) -> None:
    touched = "test -e /etc/ddpfleet || grep -q 'ddpfleet managed' /etc/hosts"
    if sandbox.ssh(node, touched).returncode == 0:
        pytest.fail(
            f"{node.name} was already changed by ddpfleet's roles; fresh-state checks need a new "
            "sandbox: run 'make sandbox-down' first",
            pytrace=False,
        )


@pytest.mark.parametrize("name", NODE_NAMES)
def test_ssh_reaches_node_with_its_own_hostname(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    assert _ok(sandbox.ssh(node, "hostname")).strip() == node.hostname


@pytest.mark.parametrize("name", NODE_NAMES)
def test_node_carries_its_fixed_ip_on_eth0(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    out = _ok(sandbox.ssh(node, "ip -4 -json address show dev eth0"))
    addresses = [a["local"] for link in json.loads(out) for a in link["addr_info"]]
    assert addresses == [node.ip]


@pytest.mark.parametrize("name", NODE_NAMES)
def test_node_reaches_every_other_node_by_ip(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    for other in sandbox.nodes:
        _ok(sandbox.ssh(node, f"ping -c 1 -W 2 {other.ip}"))


@pytest.mark.parametrize("name", NODE_NAMES)
def test_etc_hosts_starts_in_debian_default_state(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    _require_fresh(sandbox, node)
    lines = _ok(sandbox.ssh(node, "cat /etc/hosts")).splitlines()
    assert f"127.0.1.1\t{node.hostname}" in lines
    # The real problem the etc_hosts role must fix: the host's name resolves to loopback.
    assert _ok(sandbox.ssh(node, f"getent hosts {node.hostname}")).split()[0] == "127.0.1.1"


@pytest.mark.parametrize("name", NODE_NAMES)
def test_etc_hosts_is_a_plain_file_ansible_can_replace(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    assert sandbox.ssh(node, "mountpoint -q /etc/hosts").returncode != 0
    # Ansible writes by rename; on Docker's bind mount this fails with EBUSY.
    _ok(sandbox.ssh(node, "cp -p /etc/hosts /etc/.hosts.e2e && mv /etc/.hosts.e2e /etc/hosts"))


@pytest.mark.parametrize("name", NODE_NAMES)
def test_node_boots_systemd_and_sshd(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    state = sandbox.ssh(node, "systemctl is-system-running").stdout.strip()
    failed = sandbox.ssh(node, "systemctl --failed --no-legend --plain").stdout
    assert state == "running", f"{node.name}: {state}; failed units: {failed}"
    assert _ok(sandbox.ssh(node, "systemctl is-active ssh")).strip() == "active"


@pytest.mark.parametrize("name", NODE_NAMES)
def test_var_lib_docker_is_a_volume_not_overlayfs(sandbox: Sandbox, name: str) -> None:
    node = _node(sandbox, name)
    fstype = _ok(sandbox.ssh(node, "findmnt --noheadings --output FSTYPE /var/lib/docker"))
    assert fstype.strip() not in ("", "overlay")


@pytest.mark.parametrize("name", NODE_NAMES)
def test_node_cannot_set_the_host_clock(sandbox: Sandbox, name: str) -> None:
    """The clock is the host's: CAP_SYS_TIME is not in the node's bounding set."""
    status = _ok(sandbox.ssh(_node(sandbox, name), "grep CapBnd /proc/1/status"))
    cap_sys_time = 25
    assert not int(status.split()[1], 16) & (1 << cap_sys_time)


def test_ansible_pings_every_node(sandbox: Sandbox) -> None:
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible"), "all", "-i", str(sandbox.inventory), "-m", "ping"],
        cwd=ROOT, env=sandbox.env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for name in NODE_NAMES:
        assert f"{name} | SUCCESS" in proc.stdout


def test_inventory_has_the_sample_shape(sandbox: Sandbox) -> None:
    proc = subprocess.run(
        [str(ROOT / ".venv/bin/ansible-inventory"), "-i", str(sandbox.inventory), "--list"],
        cwd=ROOT, env=sandbox.env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    inv = json.loads(_ok(proc))
    hostvars = inv["_meta"]["hostvars"]
    assert inv["trainers"]["hosts"] == NODE_NAMES
    assert inv["nfs_server"]["hosts"] == ["node1"]
    assert inv["registry"]["hosts"] == ["node1"]
    for node in sandbox.nodes:
        assert hostvars[node.name]["cluster_ip"] == node.ip == hostvars[node.name]["ansible_host"]
        assert hostvars[node.name]["node_hostname"] == node.hostname
        assert hostvars[node.name]["cluster_cidr"] == sandbox.subnet
        assert hostvars[node.name]["nfs_client_mode"] == sandbox.mode
        # Ansible logs in as a sudo user, as on a real cluster (inventory/sample: ubuntu)
        assert hostvars[node.name]["ansible_user"] == "ops"
        assert hostvars[node.name]["ansible_become"] is True


def test_key_pair_is_private(sandbox: Sandbox) -> None:
    assert sandbox.key.stat().st_mode & 0o777 == 0o600
    first = sandbox.nodes[0]
    assert _ok(sandbox.ssh(first, "stat -c %a /root/.ssh/authorized_keys")).strip() == "600"
    keys = _ok(sandbox.ssh(first, "stat -c '%U %a' ~ops/.ssh/authorized_keys ~ops/.ssh"))
    assert keys.split() == ["ops", "600", "ops", "700"]


def test_the_login_user_has_passwordless_sudo_and_no_more(sandbox: Sandbox) -> None:
    first = sandbox.nodes[0]
    login = ["ssh", "-i", str(sandbox.key), *SSH_OPTIONS, f"ops@{first.ip}"]
    proc = subprocess.run([*login, "id -u; sudo -n id -u"], capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    uid, root = _ok(proc).split()
    assert (int(uid) != 0, root) == (True, "0")
    denied = subprocess.run([*login, "cat /etc/shadow"], capture_output=True, text=True,
                            timeout=60, check=False)  # fmt: skip
    assert denied.returncode != 0
    assert "Permission denied" in denied.stderr


def test_storage_mode_matches_the_host_kernel(sandbox: Sandbox) -> None:
    kernel_nfs = any(
        line.split()[-1:] in (["nfs"], ["nfs4"])
        for line in Path("/proc/filesystems").read_text().splitlines()
    )
    assert sandbox.mode == ("nfs" if kernel_nfs else "shared_volume")
    assert f"storage mode: {sandbox.mode}" in _ok(sandbox_cli("status"))


def test_shared_storage_matches_the_mode(sandbox: Sandbox) -> None:
    """shared_volume: node1's export dir and every node's shared mount are one volume.

    nfs: only node1 has the export volume; the nfs_client role mounts it on the nodes.
    """
    first = sandbox.nodes[0]
    probe = "sandbox-e2e-probe"
    _ok(
        sandbox.ssh(
            first, f"mountpoint -q /srv/ddpfleet && echo {first.hostname} > /srv/ddpfleet/{probe}"
        )
    )
    try:
        for node in sandbox.nodes:
            seen = sandbox.ssh(node, f"cat /mnt/ddpfleet/{probe}")
            if sandbox.mode == "shared_volume":
                assert _ok(seen).strip() == first.hostname
            else:
                assert seen.returncode != 0, f"{node.name} sees the export before NFS is mounted"
    finally:
        sandbox.ssh(first, f"rm -f /srv/ddpfleet/{probe}")


def test_nfs_server_is_not_preinstalled(sandbox: Sandbox) -> None:
    first = sandbox.nodes[0]
    _require_fresh(sandbox, first)
    assert sandbox.ssh(first, "dpkg -s nfs-ganesha").returncode != 0


def test_registry_node_sees_wheelhouse_and_trainer_base(sandbox: Sandbox) -> None:
    first = sandbox.nodes[0]
    out = _ok(sandbox.ssh(first, "ls /opt/ddpfleet/wheelhouse /opt/ddpfleet/images"))
    assert "trainer-base.tar" in out
    assert any(line.startswith("torch-") and line.endswith(".whl") for line in out.split())


def test_up_repairs_a_missing_node(sandbox: Sandbox) -> None:
    last = sandbox.nodes[-1]
    subprocess.run(["docker", "rm", "--force", last.hostname], capture_output=True, check=True)
    proc = sandbox_cli("up", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert f"{last.name}  {last.hostname}  {last.ip}  created" in proc.stdout
    assert _ok(sandbox.ssh(last, "hostname")).strip() == last.hostname


def test_up_again_is_a_quick_no_op(sandbox: Sandbox) -> None:
    before = docker_names("container", LABEL_FILTER)
    proc = sandbox_cli("up", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "running, booted" in proc.stdout
    assert docker_names("container", LABEL_FILTER) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--nodes", "0"], "node count must be between 1 and"),
        (["--nodes", "three"], "is not a whole number"),
        (["--subnet", "10.213.97.0/33"], "is not an IPv4 network"),
        (["--subnet", "8.8.8.0/24"], "is not a private address range"),
    ],
)
def test_bad_input_is_one_line_and_creates_nothing(args: list[str], message: str) -> None:
    before = [docker_names(kind, LABEL_FILTER) for kind in ("container", "network", "volume")]
    proc = sandbox_cli("up", *args, timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    after = [docker_names(kind, LABEL_FILTER) for kind in ("container", "network", "volume")]
    assert after == before


def test_subnet_overlapping_a_docker_network_is_refused() -> None:
    other = "ddpfleet-e2e-unrelated-net"
    subprocess.run(
        ["docker", "network", "create", "--label", "io.ddpfleet.e2e=1",
         "--subnet", "10.213.201.0/24", other],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    try:
        before = docker_names("container", LABEL_FILTER)
        proc = sandbox_cli("up", "--subnet", "10.213.201.128/25", timeout=120)
        assert proc.returncode == 1
        assert proc.stderr.count("\n") == 1, proc.stderr
        assert f"already in use by docker network '{other}'" in proc.stderr
        assert docker_names("container", LABEL_FILTER) == before
    finally:
        subprocess.run(["docker", "network", "rm", other], capture_output=True, check=False)


def test_no_docker_engine_is_one_line(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    proc = subprocess.run(
        [sys.executable, "-m", "sandbox", "up"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("sandbox: no Docker engine answers")
