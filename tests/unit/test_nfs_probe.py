"""nfs_client's probe script on local paths: several actions in one call (how verify.yml reads
the next node's probe, removes it and checks root_squash in one round trip), run in order, the
first that fails ending the call; and verify.yml's condition for a node to remove its own probe.
Its NFS URLs and the squash itself are checked on the sandbox (the e2e's site.yml and
tests/infra/test_nfs.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from plugin_loader import ROOT, local_playbook

PROBE = ROOT / "roles/nfs_client/files/ddpfleet-nfs-probe"
OWNER = 65534  # nobody: the probe drops to the owner uid with setpriv, which needs root

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="drops to another uid: the unit tier runs as root"
)


def probe(*args: str | Path) -> subprocess.CompletedProcess[str]:
    ids = ["-u", str(OWNER), "-g", str(OWNER)]
    return subprocess.run(
        [str(PROBE), *ids, *map(str, args)], check=False, capture_output=True, text=True
    )


@pytest.fixture
def runs() -> Iterator[Path]:
    """A directory the owner uid writes in (pytest's own are closed to other users)."""
    base = Path(tempfile.mkdtemp(prefix="nfs-probe-"))
    base.chmod(0o711)
    path = base / "runs"
    path.mkdir()
    os.chown(path, OWNER, OWNER)
    yield path
    shutil.rmtree(base)


@as_root
def test_one_call_reads_removes_and_checks_root(runs: Path) -> None:
    mine, theirs = runs / ".nfs-probe-node1-t", runs / ".nfs-probe-node2-t"
    for path in (mine, theirs):
        assert probe("write", path, f"t {path.name}").returncode == 0
    assert theirs.stat().st_uid == OWNER
    done = probe("read", theirs, theirs, "--", "remove", theirs, "--", "root-denied", runs / "x")
    # root may write here (no NFS): the last action fails, after the first two did their work
    assert done.returncode == 1
    assert done.stdout.splitlines() == [f"t {theirs.name}"] * 2
    assert "root_squash NOT enforced" in done.stderr
    assert not theirs.exists()
    assert mine.exists()
    assert not (runs / "x").exists()  # the root probe's file is taken away again


@as_root
def test_the_first_failing_action_ends_the_call(runs: Path) -> None:
    kept = runs / ".nfs-probe-node3-t"
    assert probe("write", kept, "t node3").returncode == 0
    done = probe("read", runs / "missing", "--", "remove", kept)
    assert done.returncode != 0
    assert kept.exists()


@pytest.mark.parametrize(
    "args", [(), ("read",), ("remove", "/nonexistent-probe", "--"), ("frob", "/x")]
)
def test_a_call_without_a_target_or_with_an_unknown_action_is_refused(
    args: tuple[str, ...],
) -> None:
    done = probe(*args)
    assert done.returncode == 2
    assert done.stderr.startswith("ddpfleet-nfs-probe: ")


def test_a_node_removes_its_own_probe_only_where_a_read_did_not_succeed(tmp_path: Path) -> None:
    """verify.yml's own condition on its always-task, run by Ansible over three hosts: where
    every node read its neighbour's probe (and so removed it) none removes its own; where one
    node's read never ran (it failed before) or failed, every node does."""
    tasks = yaml.safe_load((ROOT / "roles/nfs_client/tasks/verify.yml").read_text())
    block = next(t for t in tasks if "always" in t)
    when = next(t["when"] for t in block["always"] if t["name"] == "Remove this node's probe")
    ok, failed = {"rc": 0, "changed": False}, {"rc": 1, "failed": True}
    # in this order: n2 has no read result at all in the first case
    cases = {
        "one-missing": [ok, None, ok],
        "all-read": [ok, ok, ok],
        "one-failed": [ok, failed, ok],
    }
    nodes = ["n1", "n2", "n3"]
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    play: list[dict] = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.add_host": {"name": n, "groups": "nodes", **local}} for n in nodes
    ]}]  # fmt: skip
    for case, reads in cases.items():
        read = dict(zip(nodes, reads, strict=True))
        play.append({"hosts": "nodes", "gather_facts": False, "tasks": [
            {"ansible.builtin.set_fact": {"__nfs_client_read": "{{ read[inventory_hostname] }}"},
             "vars": {"read": read}, "when": "read[inventory_hostname] is not none"},
            {"ansible.builtin.debug": {"msg": f"RAN {case} {{{{ inventory_hostname }}}}"},
             "when": when},
        ]})  # fmt: skip
    book = tmp_path / "play.yml"
    book.write_text(json.dumps(play))
    out = local_playbook(book)
    assert out.startswith("rc=0"), out
    ran = {(c, n) for c in cases for n in nodes if f"RAN {c} {n}" in out}
    assert ran == {(c, n) for c in ("one-missing", "one-failed") for n in nodes}, out
