"""Docker: running engine, daemon.json keys ddpfleet owns, and their effect on dockerd."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest


def test_docker_service_runs(assert_service: Callable[[str], None]) -> None:
    assert_service("docker")


def test_daemon_json_is_root_owned_0644(host: Any) -> None:
    daemon = host.file("/etc/docker/daemon.json")
    assert (daemon.user, daemon.group, daemon.mode) == ("root", "root", 0o644)


def test_daemon_json_is_a_json_object(host: Any) -> None:
    text = host.file("/etc/docker/daemon.json").content_string
    assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize(
    ("key", "setting"),
    [
        ("live-restore", "docker_live_restore"),
        ("log-driver", None),
        ("log-opts.max-size", "docker_log_max_size"),
        ("log-opts.max-file", "docker_log_max_file"),
    ],
)
def test_daemon_json_managed_key(
    daemon_json: dict[str, Any],
    key: str,
    setting: str | None,
    ansible_var: Callable[[str], Any],
) -> None:
    value: Any = daemon_json
    for part in key.split("."):
        value = value[part]
    if setting is None:
        assert value == "json-file"
    elif isinstance(value, bool):
        assert value is bool(ansible_var(setting))
    else:
        assert value == str(ansible_var(setting))


def test_dockerd_applies_live_restore(host: Any) -> None:
    assert host.check_output("docker info --format '{{json .LiveRestoreEnabled}}'") == "true"


def test_dockerd_logs_with_json_file(host: Any) -> None:
    assert host.check_output("docker info --format '{{.LoggingDriver}}'") == "json-file"


def test_docker_modules_python_dependency(host: Any) -> None:
    """community.docker modules run on the node's python3 and need requests."""
    assert host.run("python3 -c 'import requests'").rc == 0


def test_unpigz_is_there_for_dockerd_to_decompress_pulls(host: Any) -> None:
    assert host.exists("unpigz")


def test_no_dockerd_restart_left_pending_without_training(host: Any) -> None:
    """A restart held back under a training run is done by the next site.yml without one."""
    marker = host.file("/etc/ddpfleet/docker-restart-pending")
    if not marker.exists:
        return
    running = host.check_output("docker ps --quiet --filter label=io.ddpfleet.run_id")
    assert running, "a held-back dockerd restart is pending but no training container runs"


def test_daemon_json_validator_accepts_the_installed_file(host: Any) -> None:
    check = host.run("/usr/local/sbin/ddpfleet-validate-daemon-json /etc/docker/daemon.json")
    assert check.rc == 0, check.stderr
