"""roles/docker's daemon.json handling, run for real on localhost against fake ``dockerd``,
``docker`` and ``systemctl`` programs: a daemon.json candidate dockerd refuses never replaces
the file, a restart held back under a training container is remembered and applied by the
next run that finds none, and a file dockerd cannot start with is put back.

The fakes record every call in a log. The validator is the role's own
files/ddpfleet-validate-daemon-json; dockerd is faked in both of its kinds: with
``--validate`` (Docker >= 23) and without (20.10, run unprivileged)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "docker"
VALIDATOR = ROLE / "files" / "ddpfleet-validate-daemon-json"
HANDLERS = ROLE / "handlers" / "main.yml"
GOOD = {
    "live-restore": True,
    "log-driver": "json-file",
    "log-opts": {"max-file": "5", "max-size": "100m"},
}

# Both fakes refuse a file holding "bogus-key" with dockerd's own wording.
REFUSE = """if grep -q bogus-key "$cfg"; then
  echo "unable to configure the Docker daemon with file $cfg:" \\
    "the following directives don't match any configuration option: bogus-key" >&2
  exit 1
fi"""
FAKE_DOCKERD = {
    "validate": f"""#!/bin/bash
echo "dockerd $*" >> "$FAKE_LOG"
[[ "$1" == --help ]] && {{ echo "  --validate   Validate daemon configuration and exit"; exit 0; }}
[[ "$1" == --validate && "$2" == --config-file ]] || {{ echo "unexpected call" >&2; exit 3; }}
cfg="$3"
{REFUSE}
echo "configuration OK"
""",
    "unprivileged": f"""#!/bin/bash
[[ "$1" == --help ]] && {{ echo "      --config-file string   Daemon configuration file"; exit 0; }}
[[ "$1" == --config-file ]] || {{ echo "unexpected call" >&2; exit 3; }}
cfg="$2"
{REFUSE}
[[ "$(id -u)" != 0 ]] && {{ echo "dockerd needs to be started with root privileges." >&2; exit 1; }}
echo "started a real daemon as root" >&2
exit 0
""",
}
FAKE_DOCKER = """#!/bin/sh
echo "docker $*" >> "$FAKE_LOG"
[ -n "$FAKE_RUNNING" ] && echo "$FAKE_RUNNING"
exit 0
"""
# A dockerd that cannot start with a daemon.json naming the zfs storage driver, as on a kernel
# without ZFS: ``systemctl restart`` fails and the journal holds dockerd's error.
FAKE_SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$FAKE_LOG"
case "$*" in
  *restart*) if grep -q zfs "$FAKE_DAEMON_JSON"; then exit 1; fi ;;
  *show*) printf 'Id=docker.service\\nLoadState=loaded\\nActiveState=active\\n'
          printf 'SubState=running\\nUnitFileState=enabled\\nMainPID=123\\n' ;;
  *is-enabled*) echo enabled ;;
esac
exit 0
"""

FAKE_JOURNALCTL = """#!/bin/sh
echo "failed to start daemon: error initializing graphdriver: driver not supported"
"""


def _make_fakes(kind: str) -> Path:
    """A directory of fake programs that an unprivileged user can run too (not under
    pytest's 0700 tmp_path): the 20.10 path runs dockerd as nobody."""
    path = Path(tempfile.mkdtemp(prefix="ddpfleet-fakes-", dir="/tmp"))
    path.chmod(0o755)
    for name, text in (
        ("dockerd", FAKE_DOCKERD[kind]),
        ("docker", FAKE_DOCKER),
        ("systemctl", FAKE_SYSTEMCTL),
        ("journalctl", FAKE_JOURNALCTL),
    ):
        (path / name).write_text(text)
        (path / name).chmod(0o755)
    (path / "log").touch()
    (path / "log").chmod(0o666)
    return path


@pytest.fixture(params=["validate", "unprivileged"])
def fakes(request: pytest.FixtureRequest) -> Iterator[Path]:
    """Both kinds of dockerd, for the validator itself."""
    path = _make_fakes(request.param)
    yield path
    shutil.rmtree(path)


@pytest.fixture
def fakes_2010() -> Iterator[Path]:
    """dockerd without --validate (Debian 12's docker.io 20.10, the sandbox's), for the
    role-level tests: the validator's harder path."""
    path = _make_fakes("unprivileged")
    yield path
    shutil.rmtree(path)


def _env(fakes: Path, running: str = "", daemon_json: str = "") -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{fakes}{os.pathsep}{os.environ['PATH']}",
        "FAKE_LOG": str(fakes / "log"),
        "FAKE_RUNNING": running,
        "FAKE_DAEMON_JSON": daemon_json or "/dev/null",
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_FILTER_PLUGINS": str(ROLE / "filter_plugins"),
    }


def validate(fakes: Path, config: dict) -> subprocess.CompletedProcess[str]:
    candidate = fakes / "candidate.json"
    candidate.write_text(json.dumps(config))
    return subprocess.run(
        [str(VALIDATOR), str(candidate)],
        env=_env(fakes), capture_output=True, text=True, timeout=within(60), check=False,
    )  # fmt: skip


def test_validator_accepts_what_dockerd_accepts(fakes: Path) -> None:
    proc = validate(fakes, GOOD)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "configuration OK"


def test_validator_refuses_what_dockerd_refuses_in_one_line(fakes: Path) -> None:
    proc = validate(fakes, {**GOOD, "bogus-key": 1})
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1, proc.stderr
    assert "don't match any configuration option: bogus-key" in proc.stderr
    assert str(fakes / "candidate.json") in proc.stderr  # the file's name, not a temp copy's


def test_validator_uses_dockerd_validate_where_it_exists(fakes: Path) -> None:
    validate(fakes, GOOD)
    calls = (fakes / "log").read_text()
    if "--help" in calls:  # the fake that knows --validate logs its calls
        assert f"dockerd --validate --config-file {fakes / 'candidate.json'}" in calls


# --- the role's tasks and handlers -------------------------------------------------------


@pytest.fixture
def node(tmp_path: Path) -> Path:
    """A play running configure.yml and service.yml with the role's real handlers."""
    (tmp_path / "files").symlink_to(ROLE / "files")  # the copy task's search path
    play = [
        {
            "name": "docker role tasks on localhost",
            "hosts": "localhost",
            "connection": "local",
            "gather_facts": False,
            "vars_files": [str(ROLE / "defaults" / "main.yml"), str(ROLE / "vars" / "main.yml")],
            "tasks": [
                {"name": f"Run {name}", "ansible.builtin.include_tasks": str(ROLE / "tasks" / name)}
                for name in ("configure.yml", "service.yml")
            ],
            "handlers": [{"name": "Handlers", "ansible.builtin.import_tasks": str(HANDLERS)}],
        }
    ]  # fmt: skip
    (tmp_path / "play.yml").write_text(json.dumps(play))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc" / "daemon.json").write_text(json.dumps(GOOD, indent=4) + "\n")
    return tmp_path


def site(node: Path, fakes: Path, running: str = "", **extra: object) -> str:
    (fakes / "log").write_text("")
    paths = {
        "_docker_daemon_json_path": str(node / "etc" / "daemon.json"),
        "_docker_daemon_json_validator": str(node / "bin" / "ddpfleet-validate-daemon-json"),
        "_docker_state_dir": str(node / "state"),
        "_docker_restart_pending_marker": str(node / "state" / "docker-restart-pending"),
        "_docker_restart_script": str(node / "bin" / "ddpfleet-restart-dockerd"),
        "ansible_python_interpreter": sys.executable,
    }
    (node / "bin").mkdir(exist_ok=True)
    playbook = Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run(
        [str(playbook), "-i", "localhost,", str(node / "play.yml"),
         "-e", json.dumps({**paths, **extra})],
        cwd=ROOT, env=_env(fakes, running, paths["_docker_daemon_json_path"]),
        capture_output=True, text=True, timeout=within(300),
        check=False,
    )  # fmt: skip
    return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"


def marker(node: Path) -> Path:
    return node / "state" / "docker-restart-pending"


def calls(fakes: Path) -> str:
    return (fakes / "log").read_text()


def test_invalid_addition_is_refused_and_the_file_kept(node: Path, fakes_2010: Path) -> None:
    before = (node / "etc" / "daemon.json").read_bytes()
    out = site(node, fakes_2010, docker_daemon_options={"bogus-key": 1})
    assert not out.startswith("rc=0"), out[-3000:]
    assert "bogus-key" in out, out[-4000:]
    assert (node / "etc" / "daemon.json").read_bytes() == before
    assert sorted(p.name for p in (node / "etc").iterdir()) == ["daemon.json"]  # no backup
    assert "restart docker" not in calls(fakes_2010)
    assert "reload docker" not in calls(fakes_2010)


def test_valid_change_replaces_the_file_and_restarts(node: Path, fakes_2010: Path) -> None:
    """Merged into the text preflight's probe read (ddpfleet_host_state.texts): the role's own
    read is skipped, and the keys it does not manage are kept from the probe's text."""
    current = node / "etc" / "daemon.json"
    probed = {"texts": {str(current): json.dumps({**GOOD, "debug": True})}}
    out = site(node, fakes_2010, docker_log_max_file=6, ddpfleet_host_state=probed)
    assert out.startswith("rc=0"), out[-3000:]
    read = out.split("Read the existing daemon.json", 1)[1].split("TASK [", 1)[0]
    assert "skipping: [localhost]" in read, out[-3000:]
    assert json.loads(current.read_text())["debug"] is True
    daemon = json.loads((node / "etc" / "daemon.json").read_text())
    assert daemon["log-opts"]["max-file"] == "6"
    assert "systemctl restart docker" in calls(fakes_2010)
    assert not marker(node).exists()


def test_a_restart_held_back_under_a_run_is_remembered_then_applied_without_one(
    node: Path, fakes_2010: Path
) -> None:
    out = site(node, fakes_2010, running="c0ffee", docker_log_max_file=6)
    assert out.startswith("rc=0"), out[-3000:]
    assert "label=io.ddpfleet.run_id" in calls(fakes_2010)
    assert "systemctl reload docker" in calls(fakes_2010)
    assert "systemctl restart docker" not in calls(fakes_2010)
    assert marker(node).exists()
    assert "c0ffee" in marker(node).read_text()
    assert stat.S_IMODE(marker(node).stat().st_mode) == 0o644
    # daemon.json already says 6 from here on: only the marker asks for the restart.
    still = site(node, fakes_2010, running="c0ffee", docker_log_max_file=6)
    assert still.startswith("rc=0"), still[-3000:]
    assert "systemctl restart docker" not in calls(fakes_2010)
    assert marker(node).exists()
    done = site(node, fakes_2010, docker_log_max_file=6)
    assert done.startswith("rc=0"), done[-3000:]
    assert calls(fakes_2010).count("systemctl restart docker") == 1
    assert not marker(node).exists()


def test_a_daemon_json_dockerd_cannot_start_with_is_put_back_and_named(
    node: Path, fakes_2010: Path
) -> None:
    """The validator passes it; the restart fails: the previous file is back, dockerd is
    restarted with it, no backup is left, and the play fails naming the host and the error."""
    before = (node / "etc" / "daemon.json").read_bytes()
    out = site(node, fakes_2010, docker_daemon_options={"storage-driver": "zfs"})
    assert not out.startswith("rc=0"), out[-3000:]
    said = " ".join(out.split())
    assert (
        "daemon.json not applied: dockerd on localhost did not start: failed to start daemon: "
        "error initializing graphdriver: driver not supported; the previous "
        "daemon.json is back and dockerd runs with it"
    ) in said, out[-3000:]
    assert (node / "etc" / "daemon.json").read_bytes() == before
    assert sorted(p.name for p in (node / "etc").iterdir()) == ["daemon.json"]
    assert calls(fakes_2010).count("systemctl restart docker.service") == 2
