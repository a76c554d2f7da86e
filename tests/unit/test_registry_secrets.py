"""The registry's controller-side secrets and their installation, run for real on localhost:
``--diff`` prints no key material, and a certificate close to expiry is re-issued.

The role's own task files (secrets.yml, then configure.yml) run in a throwaway play whose
paths all point into a temporary directory; handlers are stubs (no systemd here)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from cryptography import x509
from registry_certs import sign_short_lived
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "registry"
RENEW_DAYS = 30


def _play(tmp: Path) -> Path:
    play = [
        {
            "name": "Registry secrets and configuration on localhost",
            "hosts": "registry",
            "gather_facts": False,
            "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
            "tasks": [
                {"name": f"Run {name}", "ansible.builtin.include_tasks": str(ROLE / "tasks" / name)}
                for name in ("secrets.yml", "configure.yml")
            ],
            "handlers": [
                {"name": "Restart the registry", "ansible.builtin.debug": {"msg": "restart stub"}},
            ],
        }
    ]  # fmt: skip
    path = tmp / "play.yml"
    path.write_text(json.dumps(play))
    return path


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("registry")
    (tmp / "etc").mkdir()
    (tmp / "templates").symlink_to(ROLE / "templates")  # the template task's search path
    (tmp / "hosts.yml").write_text(
        json.dumps(
            {
                "all": {
                    "children": {
                        "registry": {
                            "hosts": {
                                "reg1": {
                                    "ansible_connection": "local",
                                    "ansible_python_interpreter": sys.executable,
                                    "cluster_ip": "127.0.0.1",
                                }
                            }
                        }
                    }
                }
            }
        )
    )
    _play(tmp)
    return tmp


def run(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    etc = workdir / "etc"
    group = "root" if os.geteuid() == 0 else str(os.getegid())
    extra = {
        "ddpfleet_secrets_dir": str(workdir / "secrets"),
        "cluster_domain": "cluster.internal",
        "registry_port": 5000,
        "_registry_config_dir": str(etc),
        "_registry_config": str(etc / "config.yml"),
        "_registry_tls_cert": str(etc / "registry.crt"),
        "_registry_tls_key": str(etc / "registry.key"),
        "_registry_htpasswd": str(etc / "htpasswd"),
        "_registry_user": group,
        "_registry_systemd_dir": str(etc / "systemd"),
        "registry_storage_dir": str(workdir / "storage"),
    }
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        # The play includes the role's task files, not the role: its plugins are named here,
        # beside the repository's own (ansible.cfg's, which this setting replaces).
        "ANSIBLE_ACTION_PLUGINS": f"{ROLE / 'action_plugins'}:{ROOT / 'action_plugins'}",
    }
    playbook = Path(sys.executable).with_name("ansible-playbook")
    return subprocess.run(
        [str(playbook), "-i", str(workdir / "hosts.yml"), str(workdir / "play.yml"),
         "-e", json.dumps(extra), *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=within(300), check=False,
    )  # fmt: skip


def _task_outputs(out: str) -> dict[str, str]:
    """What a run printed for each task, by the task's name."""
    return {part.split("]", 1)[0]: part for part in out.split("TASK [")[1:]}


def _generation_tasks() -> list[str]:
    """The names of secrets.yml's tasks that make and renew the secrets (its block's)."""
    tasks = yaml.safe_load((ROLE / "tasks" / "secrets.yml").read_text())
    return [task["name"] for item in tasks for task in item.get("block", [])]


def _skipped(out: str, name: str) -> bool:
    printed = _task_outputs(out)[name]
    return "skipping: [reg1]" in printed and not {"ok: [", "changed: ["} & set(printed.split())


def _not_after(path: Path) -> dt.datetime:
    return x509.load_pem_x509_certificate(path.read_bytes()).not_valid_after_utc


@pytest.fixture(scope="module")
def first_run(workdir: Path) -> subprocess.CompletedProcess[str]:
    return run(workdir, "--diff")


def test_first_run_succeeds(first_run: subprocess.CompletedProcess[str]) -> None:
    assert first_run.returncode == 0, first_run.stdout[-3000:] + first_run.stderr[-2000:]


def test_the_first_run_says_what_the_secrets_lack(
    first_run: subprocess.CompletedProcess[str],
) -> None:
    assert first_run.returncode == 0
    printed = _task_outputs(first_run.stdout)["Show what the secrets lack"]
    assert "ca.key: missing" in printed
    assert "registry.htpasswd: missing" in printed


@pytest.mark.parametrize("args", [(), ("--check",)], ids=["run", "check mode"])
def test_a_run_after_the_first_skips_the_generation_and_changes_nothing(
    first_run: subprocess.CompletedProcess[str], workdir: Path, args: tuple[str, ...]
) -> None:
    assert first_run.returncode == 0
    files = sorted((workdir / "secrets").iterdir())
    before = [(path, path.stat().st_mtime_ns, path.read_bytes()) for path in files]
    proc = run(workdir, *args)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert len(_generation_tasks()) >= 10
    for name in _generation_tasks():
        assert _skipped(proc.stdout, name), _task_outputs(proc.stdout)[name]
    assert " changed=0 " in proc.stdout
    after = sorted((workdir / "secrets").iterdir())
    assert [(path, path.stat().st_mtime_ns, path.read_bytes()) for path in after] == before


def test_diff_shows_no_key_or_password_material(
    first_run: subprocess.CompletedProcess[str], workdir: Path
) -> None:
    assert first_run.returncode == 0, first_run.stdout[-3000:]
    out = first_run.stdout + first_run.stderr
    password = (workdir / "secrets" / "registry_password").read_text().strip()
    htpasswd = (workdir / "etc" / "htpasswd").read_text().strip()
    assert "PRIVATE KEY" not in out
    assert password not in out
    assert htpasswd.split(":", 1)[1] not in out
    for bcrypt in ("$2y$", "$2b$", "$2a$"):
        assert bcrypt not in out
    # The diff is still shown where nothing secret is handled (the registry's config).
    assert "config.yml" in out


def test_installed_key_and_htpasswd_match_the_controller(
    first_run: subprocess.CompletedProcess[str], workdir: Path
) -> None:
    assert first_run.returncode == 0
    secrets, etc = workdir / "secrets", workdir / "etc"
    assert (etc / "registry.key").read_bytes() == (secrets / "registry.key").read_bytes()
    assert (etc / "htpasswd").read_bytes() == (secrets / "registry.htpasswd").read_bytes()


def test_a_certificate_with_time_left_is_kept(
    first_run: subprocess.CompletedProcess[str], workdir: Path
) -> None:
    assert first_run.returncode == 0
    secrets = workdir / "secrets"
    sign_short_lived(secrets, RENEW_DAYS + 30)
    kept = (secrets / "registry.crt").read_bytes()
    proc = run(workdir)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert (secrets / "registry.crt").read_bytes() == kept
    assert _skipped(proc.stdout, "Sign the registry's certificate with the cluster CA")


def test_a_certificate_close_to_expiry_is_reissued_and_installed(
    first_run: subprocess.CompletedProcess[str], workdir: Path
) -> None:
    assert first_run.returncode == 0
    secrets, etc = workdir / "secrets", workdir / "etc"
    sign_short_lived(secrets, RENEW_DAYS - 20)
    proc = run(workdir)
    assert proc.returncode == 0, proc.stdout[-3000:]
    printed = _task_outputs(proc.stdout)["Show what the secrets lack"]
    assert f"registry.crt: expires within {RENEW_DAYS} days" in printed
    now = dt.datetime.now(dt.timezone.utc)
    assert _not_after(secrets / "registry.crt") > now + dt.timedelta(days=RENEW_DAYS + 700)
    assert (etc / "registry.crt").read_bytes() == (secrets / "registry.crt").read_bytes()
    assert "restart stub" in proc.stdout


SECRET_MODULES = {
    "community.crypto.openssl_privatekey",
    "community.general.htpasswd",
    "community.docker.docker_login",
}
SECRET_NAMES = (
    "registry_password",
    "_registry_secrets.key",
    "_registry_secrets.ca_key",
    "_registry_secrets.htpasswd",
    "_registry_tls_key",
    "_registry_htpasswd",
)


def _tasks(items: list[dict]) -> list[dict]:
    found = []
    for item in items or []:
        for section in ("block", "rescue", "always"):
            found += _tasks(item.get(section, []))
        if not {"block", "rescue", "always"} & set(item):
            found.append(item)
    return found


def _secret_tasks() -> list[tuple[str, dict]]:
    tasks = []
    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for task in _tasks(yaml.safe_load(path.read_text()) or []):
            text = json.dumps({k: v for k, v in task.items() if k != "name"})
            if SECRET_MODULES & set(task) or any(name in text for name in SECRET_NAMES):
                tasks.append((f"{path.relative_to(ROOT)}: {task.get('name')}", task))
    return tasks


def test_secret_tasks_are_found() -> None:
    names = [name for name, _ in _secret_tasks()]
    assert any("Log Docker in" in name for name in names)
    assert any("TLS key and password file" in name for name in names)


@pytest.mark.parametrize(("where", "task"), _secret_tasks(), ids=lambda v: str(v)[:90])
def test_every_task_handling_a_secret_hides_it(where: str, task: dict) -> None:
    assert task.get("no_log") is True, f"{where}: no_log: true missing"
    assert task.get("diff") is False, f"{where}: diff: false missing"
