"""preflight's host probe (roles/preflight/library/ddpfleet_host_probe.py): what it reads as
installed and as running, and how the later roles' conditions act on it, run for real."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin, local_playbook

probe = load_plugin("ddpfleet_host_probe", "roles/preflight/library/ddpfleet_host_probe.py")

STATUS = """Package: docker.io
Status: install ok installed
Priority: optional
Description: Linux container runtime
 Status: install ok installed (a description line, not a field)

Package: pigz
Status: deinstall ok config-files
Version: 2.6-1

Package: munge
Status: install ok half-configured

Package: prometheus
Status: install ok installed
"""


def test_only_fully_installed_packages_count() -> None:
    assert probe.installed(STATUS) == ["docker.io", "prometheus"]


def test_the_hosts_own_dpkg_database_reads() -> None:
    status = Path("/var/lib/dpkg/status")
    if not status.is_file():
        pytest.skip("no dpkg on this host")
    assert "dpkg" in probe.installed(status.read_text(encoding="utf-8", errors="replace"))


UNITS = """docker.service          loaded    active   running Docker Application Container Engine
munge.service           loaded    inactive dead    MUNGE authentication service
slurmd.service          loaded    active   running Slurm node daemon
auditd.service          not-found inactive dead    auditd.service
prometheus.service      loaded    activating start-pre Monitoring system
"""
FILES = """docker.service             enabled  enabled
munge.service              enabled  enabled
slurmd.service             disabled enabled
prometheus.service         enabled  enabled
autovt@.service            alias    -
"""


def test_a_service_is_up_only_when_active_and_enabled() -> None:
    # slurmd runs but is disabled, munge is enabled but stopped, prometheus is still starting:
    # each one's start task must run.
    assert probe.up(UNITS, FILES) == ["docker.service"]


def _vars(role: str) -> dict:
    return yaml.safe_load(Path(f"roles/{role}/vars/main.yml").read_text())


HOSTS = "127.0.0.1\tlocalhost\n127.0.1.1\tnode1.example node1\n::1\tlocalhost ip6-localhost\n"
HELD_BACK = "Look for a dockerd restart an earlier run held back"
RETRY = "Retry the held-back dockerd restart"
NO_127 = "Remove the 127.0.1.1 mapping of this host's name"
CREDS = "Keep Docker's credentials readable by root only"


def test_what_the_probe_reads_for_later_roles_is_theirs(tmp_path: Path) -> None:
    """preflight's probe looks for the docker role's held-back restart marker, Docker's
    credentials file, the line etc_hosts removes and the daemon.json the docker role merges
    into: the same paths and pattern as theirs; the
    pattern finds that line, and a file's owner and mode read as the file task sets them."""
    asked = _vars("preflight")
    assert asked["_preflight_probe_exists"] == [
        _vars("docker")["_docker_restart_pending_marker"],
        _vars("registry")["_registry_docker_config"],
    ]
    assert asked["_preflight_probe_texts"] == [_vars("docker")["_docker_daemon_json_path"]]
    creds = tmp_path / "config.json"
    creds.write_text("{}")
    creds.chmod(0o600)
    mine = {"uid": os.getuid(), "gid": os.getgid(), "mode": "0600"}
    assert probe.owner_and_mode([str(creds), str(tmp_path / "none")]) == {str(creds): mine}
    tasks = yaml.safe_load(Path("roles/etc_hosts/tasks/configure.yml").read_text())
    removal = next(t for t in tasks if t["name"] == NO_127)["ansible.builtin.lineinfile"]
    assert asked["_preflight_probe_lines"] == {
        _vars("etc_hosts")["_etc_hosts_path"]: removal["regexp"]
    }
    assert probe.matching(HOSTS, removal["regexp"]) == ["127.0.1.1\tnode1.example node1"]
    assert probe.matching(HOSTS.replace("127.0.1.1", "10.0.0.5"), removal["regexp"]) == []


def test_the_roles_conditions_skip_only_what_is_done(tmp_path: Path) -> None:
    """The same expressions as the roles' apt and start tasks, and the docker and etc_hosts
    roles' own conditions (read from their task files): without the fact (a role run without
    preflight) each runs; with it, only a missing package, a stopped service, a marker that is
    there, a 127.0.1.1 line that is there, or a credentials file that a login rewrote or whose
    owner or mode is off."""
    missing = "{} is not subset(ddpfleet_host_state.packages | default([]))"
    stopped = "{} not in (ddpfleet_host_state.services | default([]))"
    held, retry = (_when("roles/docker/tasks/service.yml", name) for name in (HELD_BACK, RETRY))
    no_127 = _when("roles/etc_hosts/tasks/configure.yml", NO_127)
    creds = _when("roles/registry/tasks/login.yml", CREDS)
    cases = {
        "no-fact-apt": missing.format("['pigz']"),
        "no-fact-start": stopped.format("'docker.service'"),
        "no-fact-marker": held,
        "no-fact-127": no_127,
        "no-fact-creds": creds,
    }
    later = {
        "installed": missing.format("['docker.io', 'prometheus']"),
        "one-missing": missing.format("['docker.io', 'pigz']"),
        "running": stopped.format("'docker.service'"),
        "stopped": stopped.format("'munge.service'"),
        "marker-read": held,
        "no-marker-retry": retry,
        "127-there": no_127,
        "creds-as-set": creds,
    }
    last = {"marker-retry": retry, "127-gone": no_127, "creds-open": creds}
    marker, hosts = (
        _vars("docker")["_docker_restart_pending_marker"],
        _vars("etc_hosts")["_etc_hosts_path"],
    )
    config = _vars("registry")["_registry_docker_config"]
    pattern = _vars("preflight")["_preflight_probe_lines"][hosts]
    private = {config: {"uid": 0, "gid": 0, "mode": "0600"}}
    state = {"packages": probe.installed(STATUS), "services": probe.up(UNITS, FILES),
             "exists": private, "lines": {hosts: probe.matching(HOSTS, pattern)}}  # fmt: skip
    gone = {**state, "exists": {marker: {}, config: {"uid": 0, "gid": 0, "mode": "0644"}},
            "lines": {hosts: []}}  # fmt: skip

    def tasks(conds: dict[str, str]) -> list[dict]:
        return [{"ansible.builtin.debug": {"msg": f"RAN {k}"}, "when": v} for k, v in conds.items()]

    play = [{"hosts": "localhost", "gather_facts": False, "tasks": [
        {"ansible.builtin.set_fact": {"_docker_restart_pending_marker": marker,
                                      "_etc_hosts_path": hosts, "_registry_docker_config": config,
                                      "__registry_login": {"changed": False}}},
        *tasks(cases),
        {"ansible.builtin.set_fact": {"ddpfleet_host_state": state}},
        *tasks(later),
        {"ansible.builtin.set_fact": {"ddpfleet_host_state": gone}},
        *tasks(last),
        {"ansible.builtin.set_fact": {"ddpfleet_host_state": state,
                                      "__registry_login": {"changed": True}}},
        *tasks({"creds-relogged": creds}),
    ]}]  # fmt: skip
    book = tmp_path / "play.yml"
    book.write_text(json.dumps(play))
    out = local_playbook(book)
    assert out.startswith("rc=0"), out
    ran = {k for k in [*cases, *later, *last, "creds-relogged"] if f"RAN {k}" in out}
    assert ran == {"no-fact-apt", "no-fact-start", "no-fact-marker", "no-fact-127",
                   "no-fact-creds", "one-missing", "stopped", "127-there", "marker-retry",
                   "creds-open", "creds-relogged"}, out  # fmt: skip


def test_free_space_is_read_where_the_path_will_be(tmp_path: Path) -> None:
    """A path that does not exist yet (/var/lib/docker before Docker) is measured on the
    filesystem of its nearest parent, and named by that filesystem's mount point."""
    later = tmp_path / "not" / "there" / "yet"
    got = probe.disk(str(later))
    fs = os.statvfs(tmp_path)
    assert abs(got["size_available"] - fs.f_bavail * fs.f_frsize) < 64 * 1024 * 1024
    assert os.path.ismount(got["mount"])
    assert str(tmp_path).startswith(got["mount"].rstrip("/") + "/") or got["mount"] == "/"
    assert probe.disk("/")["mount"] == "/"


PASSWD = """root:x:0:0:root:/root:/bin/bash
# a comment line
+@netgroup::::::
ddpfleet:x:2000:2000::/nonexistent:/usr/sbin/nologin
short:x:1
"""
GROUP = """root:x:0:
ddpfleet:x:2000:
docker:x:999:ops
"""


def test_local_accounts_read_as_numbers_home_and_shell() -> None:
    users = probe.accounts(PASSWD, (2, 3, 5, 6))
    assert users == {
        "root": [0, 0, "/root", "/bin/bash"],
        "ddpfleet": [2000, 2000, "/nonexistent", "/usr/sbin/nologin"],
    }
    assert {k: v[0] for k, v in probe.accounts(GROUP, (2,)).items()} == {
        "root": 0, "ddpfleet": 2000, "docker": 999,
    }  # fmt: skip


def _when(path: str, name: str) -> str:
    tasks = yaml.safe_load(Path(path).read_text())
    return next(t["when"] for t in tasks if t["name"] == name).strip()


OWNER_TASKS = {
    "group": "Create the group that owns the shared directories",
    "user": "Create the user that owns the shared directories",
}


def test_the_owner_account_tasks_run_unless_the_account_is_as_asked(tmp_path: Path) -> None:
    """The nfs roles' own conditions (read from their task files), run by ansible: the group
    and user tasks run without the fact, for a missing account and for one that differs in
    any field the task sets; they skip only an account exactly as asked."""
    conds = {
        kind: _when("roles/nfs_client/tasks/owner.yml", name) for kind, name in OWNER_TASKS.items()
    }
    server = {
        kind: _when("roles/nfs_server/tasks/directories.yml", name).replace(
            "_nfs_server_", "_nfs_client_"
        )
        for kind, name in OWNER_TASKS.items()
    }
    assert server == conds  # the two roles decide alike
    users = probe.accounts(PASSWD, (2, 3, 5, 6))
    groups = {k: v[0] for k, v in probe.accounts(GROUP, (2,)).items()}
    cases = {
        "as-asked": (users, groups),
        "missing": ({}, {}),
        "other-uid": ({"ddpfleet": [2001, 2000, "/nonexistent", "/usr/sbin/nologin"]}, groups),
        "other-shell": ({"ddpfleet": [2000, 2000, "/nonexistent", "/bin/bash"]}, groups),
        "other-gid": (users, {"ddpfleet": 2001}),
    }
    fixed = {"nfs_owner_name": "ddpfleet", "nfs_owner_uid": "2000", "nfs_owner_gid": 2000,
             "_nfs_client_nologin": "/usr/sbin/nologin"}  # fmt: skip
    tasks: list[dict] = [
        {"ansible.builtin.debug": {"msg": f"RAN nofact-{kind}"}, "when": cond}
        for kind, cond in conds.items()
    ]
    for case, (u, g) in cases.items():
        tasks.append(
            {"ansible.builtin.set_fact": {"ddpfleet_host_state": {"users": u, "groups": g}}}
        )
        tasks += [
            {"ansible.builtin.debug": {"msg": f"RAN {case}-{kind}"}, "when": cond}
            for kind, cond in conds.items()
        ]
    play = [{"hosts": "localhost", "gather_facts": False, "vars": fixed, "tasks": tasks}]
    book = tmp_path / "play.yml"
    book.write_text(json.dumps(play))
    out = local_playbook(book)
    assert out.startswith("rc=0"), out
    ran = {line.split("RAN ", 1)[1].split('"')[0] for line in out.splitlines() if "RAN " in line}
    assert ran == {
        "nofact-group", "nofact-user", "missing-group", "missing-user",
        "other-uid-user", "other-shell-user", "other-gid-group",
    }, out  # fmt: skip
