"""Thin, typed calls to the ``docker`` CLI and other host commands.

Every failure becomes a :class:`SandboxError` carrying one line for the user.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Sequence
from typing import Any

LABEL = "io.ddpfleet.sandbox"
"""Label on every container, network and volume the sandbox creates (value ``1``)."""
CACHE_LABEL = "io.ddpfleet.sandbox.cache"
"""Label on the cached node/trainer-base images (kept by ``down``, removed by ``--purge``)."""


class SandboxError(Exception):
    """A problem to report to the user as one line, with a non-zero exit."""


def run(
    args: Sequence[str],
    *,
    input_data: bytes | None = None,
    check: bool = True,
    timeout: float | None = None,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run a host command and capture its text output (``env``: added to ours)."""
    try:
        proc = subprocess.run(
            list(args),
            env={**os.environ, **env} if env else None,
            input=input_data.decode() if input_data is not None else None,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )
    except FileNotFoundError as exc:
        raise SandboxError(f"{args[0]} is not installed on this host") from exc
    except subprocess.TimeoutExpired as exc:
        raise SandboxError(f"'{' '.join(args[:3])} …' timed out after {timeout:.0f}s") from exc
    if check and proc.returncode != 0:
        raise SandboxError(f"'{' '.join(args[:4])} …' failed: {last_line(proc.stderr)}")
    return proc


def last_line(text: str) -> str:
    """The last non-empty line of a command's output (docker puts its error there)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def docker(*args: str, check: bool = True, timeout: float | None = 300) -> str:
    """Run ``docker ARGS`` and return its stdout stripped."""
    return run(["docker", *args], check=check, timeout=timeout).stdout.strip()


def docker_ok(*args: str, timeout: float | None = 60) -> bool:
    """True when ``docker ARGS`` exits 0."""
    return run(["docker", *args], check=False, timeout=timeout).returncode == 0


def inspect(kind: str, name: str) -> dict[str, Any] | None:
    """``docker <kind> inspect NAME`` as a dict, or None when it does not exist."""
    proc = run(["docker", kind, "inspect", name], check=False, timeout=60)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout)
    return data[0] if data else None


def labelled(kind: str, label: str = LABEL) -> list[str]:
    """Names of the containers/networks/volumes carrying ``label``."""
    fmt = "{{.Names}}" if kind == "container" else "{{.Name}}"
    extra = ["--all"] if kind == "container" else []
    out = docker(kind, "ls", *extra, "--filter", f"label={label}", "--format", fmt)
    return sorted(out.split())


def engine_version() -> str:
    """The engine's version, or a SandboxError when no engine answers."""
    proc = run(["docker", "info", "--format", "{{.ServerVersion}}"], check=False, timeout=30)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise SandboxError(
            "no Docker engine answers (docker info failed: "
            f"{last_line(proc.stderr)}); start one or run sandbox/host-deps.sh"
        )
    return proc.stdout.strip()
