"""nfs_client's probe script on local paths: several actions in one call (how verify.yml reads
the next node's probe, removes it and checks root_squash in one round trip), run in order, the
first that fails ending the call. Its NFS URLs and the squash itself are checked on the sandbox
(the e2e's site.yml and tests/infra/test_nfs.py)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

PROBE = Path(__file__).resolve().parents[2] / "roles/nfs_client/files/ddpfleet-nfs-probe"
OWNER = 65534  # nobody: the probe drops to the owner uid with setpriv, which needs root

pytestmark = pytest.mark.skipif(
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
