"""SSH host keys: checked for every inventory but the sandbox's generated one."""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
from pathlib import Path

import yaml
from time_bounds import within

from sandbox import inventory
from sandbox.settings import make_settings

ROOT = Path(__file__).resolve().parents[2]


def test_ansible_cfg_does_not_turn_host_key_checking_off() -> None:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    assert cfg.getboolean("defaults", "host_key_checking", fallback=True) is True
    ssh_args = cfg.get("ssh_connection", "ssh_args", fallback="")
    assert "StrictHostKeyChecking" not in ssh_args
    assert "UserKnownHostsFile" not in ssh_args


def test_ansible_resolves_host_key_checking_on_for_the_sample_inventory() -> None:
    """What Ansible itself makes of ansible.cfg and the sample's variables."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    env.pop("ANSIBLE_HOST_KEY_CHECKING", None)
    config = Path(sys.executable).with_name("ansible-config")
    dump = subprocess.run(
        [str(config), "dump", "--type", "base", "--format", "json"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=within(120), check=True,
    )  # fmt: skip
    settings = {item.get("name"): item.get("value") for item in yaml.safe_load(dump.stdout)}
    assert settings["HOST_KEY_CHECKING"] is True
    sample = (ROOT / "inventory" / "sample" / "hosts.yml").read_text()
    group_vars = "".join(
        p.read_text() for p in (ROOT / "inventory" / "sample" / "group_vars").rglob("*.yml")
    )
    for text in (sample, group_vars):
        assert "StrictHostKeyChecking" not in text.replace("ssh-keyscan", "")
        assert "host_key_checking" not in text


def test_sample_inventory_says_how_to_record_host_keys() -> None:
    assert "ssh-keyscan" in (ROOT / "inventory" / "sample" / "hosts.yml").read_text()


def test_sandbox_inventory_relaxes_checking_for_its_own_nodes_only() -> None:
    hosts = yaml.safe_load(inventory.hosts_yaml(make_settings("10.213.97.0/24", 3)))
    group_vars = hosts["all"]["vars"]
    args = group_vars["ansible_ssh_common_args"].split()
    assert "StrictHostKeyChecking=no" in args
    assert "UserKnownHostsFile=/dev/null" in args
    assert group_vars["ansible_host_key_checking"] is False
    # Relaxed for the sandbox's hosts, which are all of that inventory's hosts, and nowhere else.
    assert set(hosts["all"]["children"]["trainers"]["hosts"]) == {"node1", "node2", "node3"}
