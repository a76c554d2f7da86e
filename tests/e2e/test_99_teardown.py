"""``python -m sandbox down``: removes everything the sandbox made, and nothing else.

Runs last (file order): it destroys the cluster the other e2e modules used.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from conftest import ROOT, Sandbox, docker_names, sandbox_cli

from sandbox.images import node_tag
from sandbox.inventory import written_files
from sandbox.settings import make_settings

LABEL_FILTER = "label=io.ddpfleet.sandbox=1"
UNRELATED = "ddpfleet-e2e-unrelated"


def _docker(*args: str) -> None:
    subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120)


@pytest.fixture(scope="module")
def torn_down(sandbox: Sandbox) -> Iterator[subprocess.CompletedProcess[str]]:
    """Create unrelated docker objects, then run ``down`` once for every test here."""
    _docker("volume", "create", "--label", "io.ddpfleet.e2e=1", UNRELATED)
    _docker(
        "create", "--name", UNRELATED, "--label", "io.ddpfleet.e2e=1",
        "--entrypoint", "/bin/true", node_tag(),
    )  # fmt: skip
    try:
        yield sandbox_cli("down", timeout=300)
    finally:
        subprocess.run(["docker", "rm", "--force", UNRELATED], capture_output=True, check=False)
        subprocess.run(["docker", "volume", "rm", UNRELATED], capture_output=True, check=False)


def test_down_succeeds(torn_down: subprocess.CompletedProcess[str]) -> None:
    assert torn_down.returncode == 0, torn_down.stderr
    assert "removed containers: ddpfleet-node1" in torn_down.stdout


@pytest.mark.parametrize("kind", ["container", "network", "volume"])
def test_nothing_labelled_remains(torn_down: subprocess.CompletedProcess[str], kind: str) -> None:
    assert torn_down.returncode == 0
    assert docker_names(kind, LABEL_FILTER) == []


@pytest.mark.parametrize(
    ("kind", "prefix"),
    [
        ("container", "ddpfleet-node"),
        ("network", "ddpfleet-sandbox"),
        ("volume", "ddpfleet-sandbox"),
    ],
)
def test_nothing_named_like_the_sandbox_remains(
    torn_down: subprocess.CompletedProcess[str], kind: str, prefix: str
) -> None:
    assert torn_down.returncode == 0
    assert [n for n in docker_names(kind) if n.startswith(prefix)] == []


def test_key_pair_and_inventory_are_gone(torn_down: subprocess.CompletedProcess[str]) -> None:
    assert torn_down.returncode == 0
    settings = make_settings(None, None)
    leftovers = [settings.key_path, settings.key_path.with_suffix(".pub")]
    leftovers += written_files(settings)
    assert [str(p) for p in leftovers if p.exists()] == []


@pytest.mark.parametrize("kind", ["container", "volume"])
def test_unrelated_objects_survive(torn_down: subprocess.CompletedProcess[str], kind: str) -> None:
    assert torn_down.returncode == 0
    assert docker_names(kind, "label=io.ddpfleet.e2e=1") == [UNRELATED]


def test_cached_node_image_is_kept(torn_down: subprocess.CompletedProcess[str]) -> None:
    assert torn_down.returncode == 0
    assert "kept the cached node/trainer-base images" in torn_down.stdout
    proc = subprocess.run(
        ["docker", "image", "inspect", node_tag()], capture_output=True, check=False
    )
    assert proc.returncode == 0


def test_down_again_is_a_no_op(torn_down: subprocess.CompletedProcess[str]) -> None:
    assert torn_down.returncode == 0
    again = sandbox_cli("down", timeout=120)
    assert again.returncode == 0, again.stderr
    assert "removed containers: none" in again.stdout


def test_node_that_fails_to_boot_is_reported_with_its_journal(
    torn_down: subprocess.CompletedProcess[str],
) -> None:
    """A node not booted within SANDBOX_BOOT_TIMEOUT: one error line plus its journal tail."""
    assert torn_down.returncode == 0
    env = {**os.environ, "SANDBOX_BOOT_TIMEOUT": "0"}
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "sandbox", "up", "--nodes", "1"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert proc.returncode == 1
        first, *journal = proc.stderr.splitlines()
        assert first.startswith("sandbox: node node1 (ddpfleet-node1) failed to boot within 0s")
        assert "last journal lines:" in first
        assert journal, "no journal lines after the error"
        assert "Traceback" not in proc.stderr
    finally:
        cleanup = sandbox_cli("down", timeout=300)
    assert cleanup.returncode == 0, cleanup.stderr
    assert docker_names("container", LABEL_FILTER) == []
