"""Who may mount the NFS export: the client-list filter, the rendered Ganesha and kernel
export files for the sample inventory, and preflight refusing a too-wide client."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from plugin_loader import load_plugin
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "nfs_server"
SAMPLE_TRAINERS = ["10.0.0.11", "10.0.0.12", "10.0.0.13"]

nfs_clients = load_plugin("ddpfleet_nfs_clients", "roles/nfs_server/filter_plugins/nfs_clients.py")


@pytest.mark.parametrize(
    "clients", [["10.0.0.11"], ["10.0.0.0/24", "192.168.1.7"], ["10.0.0.0/8"], ["172.16.0.0/12"]]
)
def test_addresses_and_narrow_networks_pass(clients: list[str]) -> None:
    assert nfs_clients.nfs_client_problems(clients) == []


@pytest.mark.parametrize(
    ("clients", "problem"),
    [
        (["10.0.0.0/7"], "10.0.0.0/7 is wider than /8"),
        (["0.0.0.0/0"], "0.0.0.0/0 is wider than /8"),
        (["10.0.0.11", "128.0.0.0/1"], "128.0.0.0/1 is wider than /8"),
        (["0.0.0.0"], "0.0.0.0 is the unspecified address"),
        (["*"], "'*' is not an IPv4 address or network"),
        (["gpu1"], "'gpu1' is not an IPv4 address or network"),
        (["10.0.0.0/33"], "'10.0.0.0/33' is not an IPv4 address or network"),
        (["fd00::/64"], "'fd00::/64' is not IPv4"),
        ([], "nfs_server_clients is empty"),
        ("10.0.0.0/24", "nfs_server_clients must be a list"),
    ],
)
def test_bad_clients_are_named(clients: list[str] | str, problem: str) -> None:
    problems = nfs_clients.nfs_client_problems(clients)
    assert len(problems) == 1
    assert problems[0].startswith(problem)


def _play(tmp: Path, tasks: list[dict]) -> Path:
    play = [{"name": "nfs_server on the sample inventory", "hosts": "nfs_server",
             "gather_facts": False, "tasks": tasks}]  # fmt: skip
    path = tmp / "play.yml"
    path.write_text(json.dumps(play))
    return path


def run_on_sample(tmp: Path, tasks: list[dict], extra: dict | None = None) -> str:
    """Run tasks on the sample's nfs_server host, connected locally; return the output."""
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
    }
    local = {"ansible_connection": "local", "ansible_become": False,
             "ansible_python_interpreter": sys.executable, **(extra or {})}  # fmt: skip
    playbook = Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run(
        [str(playbook), "-i", "inventory/sample/hosts.yml", str(_play(tmp, tasks)),
         "-e", json.dumps(local)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=within(180), check=False,
    )  # fmt: skip
    return f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"


PREFLIGHT = {
    "name": "Check the role's settings",
    "ansible.builtin.include_role": {
        "name": "nfs_server",
        "tasks_from": "preflight",
        "public": True,
    },
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    tmp = tmp_path_factory.mktemp("nfs")
    tasks = [PREFLIGHT] + [
        {
            "name": f"Render {name}",
            "ansible.builtin.copy": {
                "content": "{{ lookup('ansible.builtin.template', '%s') }}"
                % (ROLE / "templates" / name),
                "dest": str(tmp / name),
                "mode": "0644",
            },
        }
        for name in ("ganesha.conf.j2", "ddpfleet.exports.j2")
    ]
    out = run_on_sample(tmp, tasks)
    assert out.startswith("rc=0"), out[-3000:]
    return {name: (tmp / name).read_text() for name in ("ganesha.conf.j2", "ddpfleet.exports.j2")}


def _block(text: str, name: str) -> str:
    start = text.index(f"\n{name} {{")
    return text[start : text.index("\n}", start)]


def test_ganesha_serves_only_the_trainers_addresses(rendered: dict[str, str]) -> None:
    client = _block(rendered["ganesha.conf.j2"], "EXPORT").split("CLIENT {", 1)[1]
    assert f"Clients = {', '.join(SAMPLE_TRAINERS)};" in client
    assert "10.0.0.0/24" not in rendered["ganesha.conf.j2"]


@pytest.mark.parametrize("block", ["EXPORT_DEFAULTS", "EXPORT"])
def test_ganesha_requires_privileged_ports(rendered: dict[str, str], block: str) -> None:
    assert "PrivilegedPort = true;" in _block(rendered["ganesha.conf.j2"], block)


def test_kernel_export_lists_each_trainer_secure_and_root_squashed(
    rendered: dict[str, str],
) -> None:
    line = next(ln for ln in rendered["ddpfleet.exports.j2"].splitlines() if ln.startswith("/"))
    path, *clients = line.split()
    assert path == "/srv/ddpfleet"
    assert [c.split("(")[0] for c in clients] == SAMPLE_TRAINERS
    for client in clients:
        options = client.split("(")[1].rstrip(")").split(",")
        assert "secure" in options
        assert "root_squash" in options
        assert "insecure" not in options


@pytest.mark.parametrize("clients", [["10.0.0.0/7"], ["10.0.0.11", "0.0.0.0/0"]])
def test_preflight_refuses_a_client_wider_than_a_slash_8(
    tmp_path: Path, clients: list[str]
) -> None:
    out = run_on_sample(tmp_path, [PREFLIGHT], {"nfs_server_clients": clients})
    assert not out.startswith("rc=0"), out[-3000:]
    assert "nfs_server_clients must list the nodes' IPv4 addresses" in out
    assert f"{clients[-1]} is wider than /8" in out
