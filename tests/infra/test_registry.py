"""Registry: TLS + htpasswd on the registry host, trusted and logged in on every node."""

from __future__ import annotations

import hashlib
import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

CONFIG = "/etc/docker/registry/config.yml"
TRUST_STORE_CA = "/usr/local/share/ca-certificates/ddpfleet-ca.crt"
DOCKER_CONFIG = "/root/.docker/config.json"
TLS_CERT = "/etc/docker/registry/registry.crt"

# GET /v2/ with the system trust store (no credentials); prints the HTTP status.
PROBE = """python3 - <<'PY'
import ssl, sys, urllib.error, urllib.request
try:
    urllib.request.urlopen("https://%s/v2/", context=ssl.create_default_context(), timeout=10)
    print(200)
except urllib.error.HTTPError as exc:
    print(exc.code)
PY"""


@pytest.fixture
def registry_host(host: Any, in_group: Callable[[str], bool]) -> Any:
    if not in_group("registry"):
        pytest.skip("not the registry host")
    return host


def test_registry_service_runs(registry_host: Any, assert_service: Callable[[str], None]) -> None:
    assert_service("docker-registry")


def test_registry_listens_on_cluster_address(
    registry_host: Any, inventory_vars: dict[str, Any], ansible_var: Callable[[str], Any]
) -> None:
    port = ansible_var("registry_port")
    assert registry_host.socket(f"tcp://{inventory_vars['cluster_ip']}:{port}").is_listening


@pytest.mark.parametrize(
    "line",
    [
        "certificate: /etc/docker/registry/registry.crt",
        "key: /etc/docker/registry/registry.key",
        "path: /etc/docker/registry/htpasswd",
    ],
)
def test_registry_config_enables_tls_and_htpasswd(registry_host: Any, line: str) -> None:
    assert line in registry_host.file(CONFIG).content_string


@pytest.mark.parametrize(
    ("path", "mode"),
    [("/etc/docker/registry/registry.key", 0o640), ("/etc/docker/registry/htpasswd", 0o640)],
)
def test_registry_secrets_readable_by_service_only(
    registry_host: Any, path: str, mode: int
) -> None:
    secret = registry_host.file(path)
    assert (secret.user, secret.group, secret.mode) == ("root", "docker-registry", mode)


def test_htpasswd_uses_bcrypt(registry_host: Any, ansible_var: Callable[[str], Any]) -> None:
    user = ansible_var("registry_username")
    entries = registry_host.file("/etc/docker/registry/htpasswd").content_string.splitlines()
    hashes = [e.split(":", 1)[1] for e in entries if e.startswith(f"{user}:")]
    assert hashes
    assert hashes[0].startswith(("$2y$", "$2b$", "$2a$"))


def test_registry_certificate_outlives_the_renewal_window(
    registry_host: Any, ansible_var: Callable[[str], Any]
) -> None:
    """site.yml re-issues it when fewer than registry_cert_renew_days (30) remain."""
    days = int(ansible_var("registry_cert_renew_days"))
    check = registry_host.run(
        "openssl x509 -noout -enddate -checkend %s -in %s", str(days * 86400), TLS_CERT
    )
    assert check.rc == 0, f"{TLS_CERT} expires within {days} days: {check.stdout.strip()}"


def test_served_certificate_is_the_installed_one(registry_host: Any, registry_address: str) -> None:
    served = registry_host.run(
        "openssl s_client -connect %s -servername %s </dev/null 2>/dev/null"
        " | openssl x509 -noout -fingerprint -sha256",
        registry_address, registry_address.rsplit(":", 1)[0],
    )  # fmt: skip
    installed = registry_host.run("openssl x509 -noout -fingerprint -sha256 -in %s", TLS_CERT)
    assert served.rc == 0, served.stderr
    assert served.stdout.strip() == installed.stdout.strip()


def test_cluster_ca_outlives_the_renewal_window(
    host: Any, ansible_var: Callable[[str], Any]
) -> None:
    days = int(ansible_var("registry_cert_renew_days"))
    check = host.run(
        "openssl x509 -noout -enddate -checkend %s -in %s", str(days * 86400), TRUST_STORE_CA
    )
    assert check.rc == 0, f"{TRUST_STORE_CA} expires within {days} days: {check.stdout.strip()}"


def test_registry_answers_401_without_credentials(host: Any, registry_address: str) -> None:
    """Also proves the system trust store holds the cluster CA (TLS verifies)."""
    assert host.check_output(PROBE % registry_address) == "401"


@pytest.mark.parametrize("which", ["docker", "system"])
def test_cluster_ca_installed(
    host: Any, which: str, registry_address: str, secrets_dir: Path
) -> None:
    path = f"/etc/docker/certs.d/{registry_address}/ca.crt" if which == "docker" else TRUST_STORE_CA
    installed = host.file(path)
    assert (installed.user, installed.mode) == ("root", 0o644)
    expected = hashlib.sha256((secrets_dir / "ca.crt").read_bytes()).hexdigest()
    assert installed.sha256sum == expected


def test_docker_credentials_are_0600(host: Any) -> None:
    config = host.file(DOCKER_CONFIG)
    assert (config.user, config.mode) == ("root", 0o600)


def test_docker_logged_in_to_registry(host: Any, registry_address: str) -> None:
    auths = json.loads(host.file(DOCKER_CONFIG).content_string).get("auths", {})
    assert registry_address in auths


def test_pull_from_registry_works(
    host: Any, registry_address: str, ansible_var: Callable[[str], Any]
) -> None:
    image = f"{registry_address}/{ansible_var('registry_smoke_repository')}:1"
    result = host.run("docker pull %s", image)
    assert result.rc == 0, result.stderr


@pytest.mark.parametrize(
    ("name", "mode"),
    [(".", 0o700), ("ca.key", 0o600), ("registry.key", 0o600), ("registry_password", 0o600)],
)
def test_controller_secrets_are_private(name: str, mode: int, secrets_dir: Path) -> None:
    """On the controller (where pytest runs): the CA key and password stay private."""
    path = secrets_dir / name
    if name == "registry_password" and not path.exists():
        pytest.skip("registry_password comes from ansible-vault, not a generated file")
    assert stat.S_IMODE(path.stat().st_mode) == mode
