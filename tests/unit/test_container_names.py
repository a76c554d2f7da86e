"""ddpfleet's own containers are out of a run_id's reach (issue 27, item 2).

A run's container is ``ddpfleet-<run_id>-<host>``. Before, the GPU preflight's container was
``ddpfleet-gpucheck-<run_id>-<host>``, the doctor's ``ddpfleet-doctor-<check>-<host>`` and the
toolkit check's ``ddpfleet-gpu-check``: the run container of run_id ``gpucheck-x``,
``doctor-compute`` or ``gpu`` (on a host named check) had that name, so one removed or refused
the other. The names are read from the roles themselves and rendered as Ansible would.
"""

from __future__ import annotations

import re
from pathlib import Path

import jinja2
import pytest
import yaml

from trainer.request import RUN_ID

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ["node1", "check", "gpu-a", "x"]


def _vars(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "vars" / "main.yml").read_text())


def _task_names(path: Path) -> list[str]:
    """The ``name:`` of every docker_container module call in a task file, blocks included."""
    found: list[str] = []

    def walk(tasks: list) -> None:
        for task in tasks or []:
            for key in ("block", "rescue", "always"):
                walk(task.get(key, []))
            module = task.get("community.docker.docker_container")
            if module:
                found.append(module["name"])

    walk(yaml.safe_load(path.read_text()))
    return found


def _render(template: str, **values: str) -> str:
    return jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(template).render(values)


def run_container(run_id: str, host: str) -> str:
    return _render(_vars("trainer_run")["_trainer_run_container"], run_id=run_id,
                   inventory_hostname=host)  # fmt: skip


def could_be_a_run_container(name: str) -> bool:
    """Some valid run_id on some host would give a run container of this name."""
    rest = name.removeprefix("ddpfleet-")
    if rest == name:
        return False
    return any(RUN_ID.fullmatch(rest[:i]) and rest[i + 1 :] for i in range(len(rest))
               if rest[i] == "-")  # fmt: skip


def internal_names() -> list[str]:
    """Every container name ddpfleet gives its own helpers, for a few run_ids and hosts."""
    doctor = _vars("doctor")
    names = [_vars("nvidia_container_toolkit")["_nvidia_container_toolkit_check_container"]]
    for host in HOSTS:
        names += [
            f"{doctor['_doctor_container_prefix']}{job}-{host}" for job in doctor["_doctor_jobs"]
        ]
        for template in _task_names(ROOT / "roles" / "trainer_run" / "tasks" / "preflight.yml"):
            names += [
                _render(template, run_id=rid, inventory_hostname=host) for rid in ("x", "r.1")
            ]
    return names


def test_the_rule_sees_the_old_collisions() -> None:
    """The check below would have caught each name of before."""
    for old in ("ddpfleet-gpucheck-x-node1", "ddpfleet-doctor-compute-node1", "ddpfleet-gpu-check"):
        assert could_be_a_run_container(old), old
    assert run_container("gpucheck-x", "node1") == "ddpfleet-gpucheck-x-node1"


@pytest.mark.parametrize("name", internal_names())
def test_no_run_container_can_take_an_internal_name(name: str) -> None:
    assert re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", name), f"not a docker name: {name}"
    assert not could_be_a_run_container(name), name


def test_the_preflight_gpu_container_is_found() -> None:
    """The walk above reads the GPU check's container (it is inside a block)."""
    names = _task_names(ROOT / "roles" / "trainer_run" / "tasks" / "preflight.yml")
    assert any("gpucheck" in n for n in names), names
