"""slurm.conf and gres.conf as the slurm role renders them (Ansible's own templating, the
role's defaults and vars): node names, CPUs, memory and GPUs per trainer, the controller,
accounting off unless a slurmdbd host is named."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "slurm"
SAMPLE = yaml.safe_load((ROOT / "inventory" / "sample" / "hosts.yml").read_text())["all"]
FACTS = {"processor_vcpus": 64, "memtotal_mb": 515_000}


def sample_hostvars() -> dict[str, dict[str, Any]]:
    """The sample inventory's hosts with their variables, plus facts as preflight gathers them
    (only under ansible_facts: ansible.cfg injects none as ansible_* variables)."""
    hosts = SAMPLE["children"]["trainers"]["hosts"]
    return {name: {"inventory_hostname": name, "ansible_facts": {"hostname": name, **FACTS},
                   **values}
            for name, values in hosts.items()}  # fmt: skip


def render(name: str, hostvars: dict[str, dict[str, Any]], **settings: Any) -> str:
    loader = DataLoader()
    # vars/main.yml's values are templates (as Ansible reads them from a role's files)
    role_vars = loader.load_from_file(str(ROLE / "vars" / "main.yml"))
    role_vars = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in role_vars.items()}
    groups = {"registry": list(SAMPLE["children"]["registry"]["hosts"]), "trainers": list(hostvars)}
    variables = {
        **loader.load_from_file(str(ROLE / "defaults" / "main.yml")),
        **role_vars,
        **settings,
        "groups": groups,
        "hostvars": hostvars,
        "inventory_hostname": groups["trainers"][0],
        "ansible_managed": "managed",
    }
    text = (ROLE / "templates" / f"{name}.j2").read_text()
    return Templar(loader=loader, variables=variables).template(trust_as_template(text))


def settings_of(conf: str) -> list[dict[str, str]]:
    """Every non-comment line as its KEY=VALUE pairs (the file's whole grammar here)."""
    lines = [line for line in conf.splitlines() if line.strip() and not line.startswith("#")]
    return [dict(word.split("=", 1) for word in line.split()) for line in lines]


def test_sample_cluster_lists_every_trainer_with_its_cpus_memory_and_gpus() -> None:
    parsed = settings_of(render("slurm.conf", sample_hostvars()))
    plain = {k: v for line in parsed if len(line) == 1 for k, v in line.items()}
    assert plain["SlurmctldHost"] == "gpu1(10.0.0.11)"
    assert plain["AuthType"] == "auth/munge"
    assert plain["AccountingStorageType"] == "accounting_storage/none"
    # a run stops with a checkpoint within train_stop_timeout (90) before SIGKILL; the epilog
    # removes what a killed task left
    assert plain["KillWait"] == "150"
    assert plain["Epilog"] == "/usr/local/libexec/ddpfleet/ddpfleet-slurm-epilog"
    assert (ROLE / "files" / "ddpfleet-slurm-epilog").is_file()
    nodes = [line for line in parsed if "NodeName" in line]
    assert nodes == [
        {"NodeName": name, "NodeHostname": name, "NodeAddr": ip, "CPUs": "64",
         "RealMemory": str(515_000 - 2048), "Gres": "gpu:8", "State": "UNKNOWN"}
        for name, ip in [("gpu1", "10.0.0.11"), ("gpu2", "10.0.0.12"), ("gpu3", "10.0.0.13")]
    ]  # fmt: skip
    (partition,) = [line for line in parsed if "PartitionName" in line]
    assert (partition["PartitionName"], partition["Nodes"]) == ("ddpfleet", "gpu1,gpu2,gpu3")
    assert partition["OverSubscribe"] == "EXCLUSIVE"


def test_gres_conf_names_each_gpu_host_s_device_files() -> None:
    hostvars = sample_hostvars()
    hostvars["gpu2"]["gpus"] = 1
    hostvars["gpu3"]["gpus"] = 0
    parsed = settings_of(render("gres.conf", hostvars))
    assert parsed == [
        {"AutoDetect": "off"},
        {"NodeName": "gpu1", "Name": "gpu", "File": "/dev/nvidia[0-7]"},
        {"NodeName": "gpu2", "Name": "gpu", "File": "/dev/nvidia0"},
    ]
    nodes = {line.get("NodeName"): line for line in settings_of(render("slurm.conf", hostvars))}
    assert (nodes["gpu2"]["Gres"], "Gres" in nodes["gpu3"]) == ("gpu:1", False)


@pytest.mark.parametrize("gpus", [None, 4])
def test_gpus_default_to_the_detected_ones(gpus: int | None) -> None:
    hostvars = sample_hostvars()
    for values in hostvars.values():
        values.pop("gpus")
        values["ansible_facts"]["ddpfleet_gpu_count"] = "2"  # a fact preflight records as text
        if gpus is not None:
            values["gpus"] = gpus
    nodes = [line for line in settings_of(render("slurm.conf", hostvars)) if "NodeName" in line]
    assert {line["Gres"] for line in nodes} == {f"gpu:{gpus or 2}"}


def test_node_name_is_the_etc_hosts_name_and_the_host_s_own_name_is_its_hostname() -> None:
    hostvars = sample_hostvars()
    hostvars["gpu1"]["node_hostname"] = "trainer-a"
    hostvars["gpu1"]["ansible_facts"]["hostname"] = "gpu1-old"
    parsed = settings_of(render("slurm.conf", hostvars))
    first = next(line for line in parsed if "NodeName" in line)
    assert (first["NodeName"], first["NodeHostname"]) == ("trainer-a", "gpu1-old")
    plain = {k: v for line in parsed for k, v in line.items()}
    assert plain["SlurmctldHost"] == "gpu1-old(10.0.0.11)"
    assert plain["Nodes"] == "trainer-a,gpu2,gpu3"


def test_a_named_slurmdbd_host_turns_accounting_on() -> None:
    conf = render("slurm.conf", sample_hostvars(), slurm_accounting_storage_host="db1")
    plain = {k: v for line in settings_of(conf) if len(line) == 1 for k, v in line.items()}
    assert plain["AccountingStorageType"] == "accounting_storage/slurmdbd"
    assert (plain["AccountingStorageHost"], plain["AccountingStoragePort"]) == ("db1", "6819")
