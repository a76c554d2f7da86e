"""site.yml on the sandbox: succeeds, re-runs with changed=0, passes the testinfra suite,
and preflight refuses bad input before any host changes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from site_fixtures import PlaybookRun, run_site

# The no-op re-run's goal is 60 s; fail only well past it, so a busy 2-core machine
# does not flake while a real regression (a rebuild, a re-pull) still fails.
RERUN_LIMIT_S = 120
BAD_CIDR = "192.0.2.0/24"  # TEST-NET-1: never the sandbox's subnet


@pytest.fixture(scope="module")
def rerun(provisioned: PlaybookRun, sandbox: Any) -> PlaybookRun:
    run = run_site(sandbox)
    print(f"\nsite.yml no-op re-run: {run.wall_s:.1f} s, rc {run.rc}")
    return run


def test_site_succeeds_on_every_node(provisioned: PlaybookRun, sandbox: Any) -> None:
    assert provisioned.rc == 0
    assert sorted(provisioned.recap) == sorted(node.name for node in sandbox.nodes)
    for host, counts in provisioned.recap.items():
        assert (counts["failed"], counts["unreachable"]) == (0, 0), host


def test_rerun_changes_nothing(rerun: PlaybookRun) -> None:
    assert rerun.rc == 0, rerun.tail()
    assert rerun.recap, rerun.tail()
    assert rerun.changed_hosts() == {}, rerun.tail()


def test_rerun_is_fast(rerun: PlaybookRun) -> None:
    assert rerun.wall_s <= RERUN_LIMIT_S


def test_testinfra_suite_passes(provisioned: PlaybookRun, sandbox: Any) -> None:
    proc = subprocess.run(
        [
            sys.executable, "-m", "pytest", "tests/infra", "-q", "-p", "no:cacheprovider",
            "--hosts=ansible://all", f"--ansible-inventory={sandbox.inventory}",
        ],
        cwd=sandbox.root, env=sandbox.env, capture_output=True, text=True,
        timeout=900, check=False,
    )  # fmt: skip
    print(proc.stdout.splitlines()[-1] if proc.stdout else proc.stderr)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]


def test_preflight_refuses_bad_cidr_before_any_change(
    provisioned: PlaybookRun, sandbox: Any
) -> None:
    """A drift site.yml would repair survives a refused run: no host was changed."""
    node = sandbox.nodes[1]
    drift = f"127.0.1.1 {node.hostname}"
    # Appending writes /etc/hosts in place (it is a bind mount in the sandbox).
    added = sandbox.ssh(node, f"echo '{drift}' >> /etc/hosts")
    assert added.returncode == 0, added.stderr

    refused = run_site(sandbox, "-e", f"cluster_cidr={BAD_CIDR}")

    assert refused.rc != 0
    assert f"is not an address inside cluster_cidr {BAD_CIDR}" in refused.stdout
    assert f"{sandbox.nodes[0].name}: cluster_ip" in refused.stdout
    assert "TASK [etc_hosts" not in refused.stdout
    assert refused.changed_hosts() == {}
    still = sandbox.ssh(node, "cat /etc/hosts")
    assert drift in still.stdout.splitlines()

    # The repair works on one host alone: etc_hosts needs no facts from other hosts.
    repaired = run_site(sandbox, "--limit", node.name, "--tags", "etc_hosts")
    assert repaired.rc == 0, repaired.tail()
    assert repaired.recap[node.name]["changed"] >= 1
    after = sandbox.ssh(node, "cat /etc/hosts")
    assert drift not in after.stdout.splitlines()


def test_docker_keeps_foreign_daemon_json_keys(provisioned: PlaybookRun, sandbox: Any) -> None:
    """A key ddpfleet does not manage, in another tool's formatting, survives untouched."""
    node = sandbox.nodes[-1]
    original = sandbox.ssh(node, "cat /etc/docker/daemon.json").stdout
    foreign = (
        'python3 -c \'import json; p="/etc/docker/daemon.json"; d=json.load(open(p)); '
        'd["max-concurrent-downloads"]=3; open(p,"w").write(json.dumps(d, indent=4))\''
    )
    try:
        assert sandbox.ssh(node, foreign).returncode == 0
        run = run_site(sandbox, "--limit", node.name, "--tags", "docker")
        assert run.rc == 0, run.tail()
        assert run.changed_hosts() == {}, run.tail()
        kept = json.loads(sandbox.ssh(node, "cat /etc/docker/daemon.json").stdout)
        assert kept["max-concurrent-downloads"] == 3
    finally:
        restore = f"cat > /etc/docker/daemon.json <<'JSON'\n{original}JSON"
        sandbox.ssh(node, restore)


def test_docker_only_reloads_under_a_training_container(
    provisioned: PlaybookRun, sandbox: Any
) -> None:
    """A daemon.json change while a run_id-labelled container runs keeps dockerd's PID."""
    node = sandbox.nodes[-1]
    image = sandbox.ssh(node, "cat /etc/ddpfleet/trainer_image").stdout.strip()
    assert image, "no trainer image recorded on the node"
    started = sandbox.ssh(
        node,
        "docker run -d --name ddpfleet-e2e-guard --label io.ddpfleet.run_id=e2e-guard "
        f"--entrypoint sleep {image} 600",
    )
    assert started.returncode == 0, started.stderr
    pid = "systemctl show --property=MainPID --value docker"
    before = sandbox.ssh(node, pid).stdout.strip()
    try:
        run = run_site(
            sandbox, "--limit", node.name, "--tags", "docker", "-e", "docker_log_max_file=6"
        )
        assert run.rc == 0, run.tail()
        assert "dockerd was only reloaded" in run.stdout
        assert sandbox.ssh(node, pid).stdout.strip() == before
        daemon = json.loads(sandbox.ssh(node, "cat /etc/docker/daemon.json").stdout)
        assert daemon["log-opts"]["max-file"] == "6"
    finally:
        sandbox.ssh(node, "docker rm -f ddpfleet-e2e-guard")
        restored = run_site(sandbox, "--limit", node.name, "--tags", "docker")
    assert restored.rc == 0, restored.tail()
    daemon = json.loads(sandbox.ssh(node, "cat /etc/docker/daemon.json").stdout)
    assert daemon["log-opts"]["max-file"] == "5"
