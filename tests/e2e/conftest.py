"""Shared fixtures of the end-to-end tier: a real sandbox cluster, brought up once.

Other e2e modules use the session-scoped ``sandbox`` fixture; its attributes are a
stable interface:

- ``sandbox.root`` — repository root (``Path``); run playbooks from there.
- ``sandbox.inventory`` — ``inventory/sandbox/hosts.yml`` (absolute ``Path``).
- ``sandbox.key`` — the generated SSH private key (``Path``).
- ``sandbox.nodes`` — list of ``SandboxNode(name, hostname, ip)``; ``nodes[0]`` is node1
  (NFS server, registry, rank 0).
- ``sandbox.mode`` — storage mode, ``"shared_volume"`` or ``"nfs"``.
- ``sandbox.subnet`` — the cluster CIDR as a string.
- ``sandbox.ssh(node, command)`` — run a shell command on a node (a ``SandboxNode`` or
  its inventory name) over SSH with the sandbox key; returns ``CompletedProcess``.
- ``sandbox.playbook(*args)`` — ``ansible-playbook -i <inventory> *args`` from the
  repository root with the repository's ansible.cfg; returns ``CompletedProcess``.
- ``sandbox.env`` — environment for Ansible commands (ANSIBLE_CONFIG, PATH with the venv).

``provisioned`` (from ``site_fixtures.py``, re-exported here) is site.yml applied once
on top of ``sandbox``.

The fixture runs ``python -m sandbox up`` (creates, repairs or reuses the sandbox) and
never tears it down: ``test_99_teardown.py`` does, last. Without a Docker engine the
fixture fails, it never skips.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:  # `python -m sandbox` lives at the repository root
    sys.path.insert(0, str(ROOT))

# `provisioned`: site.yml applied once; FIRST_SITE_SLOWEST: its slowest tasks, and FIGURES: the
# tier's measured times (site_fixtures.figure), both for the summary
from site_fixtures import FIGURES, FIRST_SITE_SLOWEST, provisioned  # noqa: E402, F401
from train_fixtures import cluster  # noqa: E402, F401 - `cluster`: provisioned, cleaned after

from sandbox.settings import make_settings  # noqa: E402

SSH_OPTIONS = [
    "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
    "-o", "LogLevel=ERROR", "-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
]  # fmt: skip
# One SSH connection per node, shared by the tests' commands (OpenSSH connection sharing): a
# fresh connection (key exchange, PAM session, logind) took ~0.3 s and a core's share of it on
# the 2-core host, and the tests poll their runs' records and containers every ~0.5 s. A
# command that fails on the shared connection itself (exit 255: a node recreated or taken down
# under it) is run again on a fresh one.
MUX_DIR = Path(tempfile.mkdtemp(prefix="ddpfleet-e2e-ssh-"))
SSH_SHARED = ["-o", "ControlMaster=auto", "-o", f"ControlPath={MUX_DIR}/%C",
              "-o", "ControlPersist=60", "-o", "ServerAliveInterval=5"]  # fmt: skip
SSH_FAILED = 255  # ssh's own error (connection, authentication), not the command's
UP_TIMEOUT = 1800  # a cold build (debootstrap + wheelhouse) takes minutes on 2 cores


@dataclass(frozen=True)
class SandboxNode:
    name: str
    hostname: str
    ip: str


@dataclass
class Sandbox:
    root: Path
    inventory: Path
    key: Path
    nodes: list[SandboxNode]
    mode: str
    subnet: str
    env: dict[str, str] = field(default_factory=dict)

    def node(self, name: str) -> SandboxNode:
        return next(n for n in self.nodes if n.name == name)

    def ssh(
        self, node: SandboxNode | str, command: str, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        target = self.node(node) if isinstance(node, str) else node
        login = [*SSH_OPTIONS, f"root@{target.ip}", command]
        for shared in (SSH_SHARED, []):
            args = ["ssh", "-i", str(self.key), *shared, *login]
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=timeout, check=False
            )
            if done.returncode != SSH_FAILED:
                break
        return done

    def playbook(self, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess[str]:
        cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook"), "-i", str(self.inventory), *args]
        # stdin: none. Ansible refuses to start on a non-blocking one, and what the tests were
        # started from may have left it so (a train.yml once failed that way beside a shell job)
        return subprocess.run(
            cmd, cwd=self.root, env=self.env, capture_output=True, text=True,
            timeout=timeout, check=False, stdin=subprocess.DEVNULL,
        )  # fmt: skip


def sandbox_cli(*args: str, timeout: float = UP_TIMEOUT) -> subprocess.CompletedProcess[str]:
    """Run ``python -m sandbox ARGS`` from the repository root."""
    return subprocess.run(
        [sys.executable, "-m", "sandbox", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def docker_names(kind: str, *filters: str) -> list[str]:
    """Names of docker objects of ``kind`` (container/network/volume) matching filters."""
    fmt = "{{.Names}}" if kind == "container" else "{{.Name}}"
    args = ["docker", kind, "ls", "--format", fmt]
    if kind == "container":
        args.append("--all")
    for flt in filters:
        args += ["--filter", flt]
    proc = subprocess.run(args, capture_output=True, text=True, check=True, timeout=60)
    return sorted(proc.stdout.split())


def _require_engine() -> None:
    proc = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    if proc.returncode != 0:
        pytest.fail(
            "no Docker engine answers (the e2e tier needs one; run sandbox/host-deps.sh): "
            + (proc.stderr.strip().splitlines() or ["docker info failed"])[-1],
            pytrace=False,
        )


@pytest.fixture(scope="session")
def sandbox() -> Sandbox:
    _require_engine()
    proc = sandbox_cli("up")
    if proc.returncode != 0:
        pytest.fail(f"'python -m sandbox up' failed:\n{proc.stdout}{proc.stderr}", pytrace=False)
    settings = make_settings(None, None)
    overrides = settings.inventory_dir / "group_vars" / "all" / "zz_sandbox.yml"
    values = yaml.safe_load(overrides.read_text())
    env = dict(os.environ)
    env["ANSIBLE_CONFIG"] = str(ROOT / "ansible.cfg")
    env["PATH"] = f"{ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return Sandbox(
        root=ROOT,
        inventory=settings.inventory_dir / "hosts.yml",
        key=settings.key_path,
        nodes=[SandboxNode(n.name, n.container, n.ip) for n in settings.nodes],
        mode=values["sandbox_storage_mode"],
        subnet=str(settings.subnet),
        env=env,
    )


def pytest_sessionfinish() -> None:
    """Close the shared SSH connections (they would linger for ControlPersist) and their dir."""
    for socket in MUX_DIR.iterdir():
        subprocess.run(["ssh", "-o", f"ControlPath={socket}", "-O", "exit", "node"],
                       capture_output=True, timeout=30, check=False)  # fmt: skip
    shutil.rmtree(MUX_DIR, ignore_errors=True)


# Where the tier's time goes, printed at its end (CI's output included): every figure the tests
# measured (the first and the no-op site.yml, launch to first step, each fault's time), then each
# module's wall time from its first test's setup to its last test's teardown. A session fixture
# counts in the module that first needs it (site.yml in test_20_site.py).
_MODULE_SPANS: dict[str, list[float]] = {}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    start = time.monotonic()
    try:
        return (yield)
    finally:
        span = _MODULE_SPANS.setdefault(item.location[0], [start, start, 0])
        span[1], span[2] = time.monotonic(), span[2] + 1


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("e2e figures")
        for line in FIGURES:
            terminalreporter.write_line(line)
    if not _MODULE_SPANS:
        return
    terminalreporter.section("e2e time per module")
    for path, (start, end, tests) in _MODULE_SPANS.items():
        terminalreporter.write_line(f"{end - start:7.0f} s {int(tests):4d} tests  {path}")
    if FIRST_SITE_SLOWEST:
        terminalreporter.section("first site.yml: slowest tasks")
        for line in FIRST_SITE_SLOWEST:
            terminalreporter.write_line(line)
