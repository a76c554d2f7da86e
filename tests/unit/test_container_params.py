"""A run container's parameters have one builder (ddpfleet_agent/container.py) and reach every
launch path whole: launch.yml builds them with it and keeps them, start.yml gives each to
community.docker.docker_container under its own name (the direct launch and relaunch.yml, which
reads the kept ones), and the Slurm task turns every one of them into ``docker run``. A key the
builder makes that one path lacks fails here."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import sys
from pathlib import Path

import pytest
import yaml

from ddpfleet_agent import container
from ddpfleet_agent.container import DOCKER_RUN, POSITIONAL, container_params, docker_run_argv

ROOT = Path(__file__).resolve().parents[2]
TASKS = ROOT / "roles" / "trainer_run" / "tasks"
ARGS = {
    "name": "ddpfleet-r1-node2", "image": "reg:5000/ddpfleet/trainer:abc", "run_id": "r1",
    "host": "node2", "node_rank": 1, "user": "2000:2000", "working_dir": "/srv/d/runs/r1",
    "datasets": "/srv/d/datasets", "run_dir": "/srv/d/runs/r1",
    "fallback_dir": "/var/lib/ddpfleet/runs/r1", "shm_size_mb": 8192,
    "ulimits": ["memlock:-1:-1"], "env": {"HOME": "/tmp"}, "entrypoint": ["python", "-m", "a"],
    "command": ["--run-id=r1", "--", "torchrun"],
}  # fmt: skip
# every branch of the builder: a host's IPC or a private /dev/shm, quota, GPUs, fabric or none
VARIANTS = {
    "private shm, quota, GPUs, fabric": {"ipc_host": False, "cpus": 0.5, "gpus": 8,
                                         "devices": ["/dev/infiniband/uverbs0"]},
    "host IPC, nothing else": {"ipc_host": True, "cpus": 0, "gpus": 0, "devices": []},
}  # fmt: skip


def built() -> list[dict]:
    return [container_params(**ARGS, **variant) for variant in VARIANTS.values()]


def every_key() -> set[str]:
    return set().union(*built())


def task(path: Path, name: str) -> dict:
    found = [t for t in yaml.safe_load(path.read_text()) if t.get("name") == name]
    assert len(found) == 1, f"{path.name}: no single task {name!r}"
    return found[0]


def test_the_variants_reach_every_branch_of_the_builder() -> None:
    source = inspect.getsource(container_params)
    optional = {k for k in every_key() if f'params["{k}"] =' in source}
    quota = {"cpu_period", "cpu_quota"}
    assert optional == {"ipc_mode", "shm_size", "device_requests", "devices"} | quota


@pytest.mark.parametrize("params", built(), ids=list(VARIANTS))
def test_the_slurm_path_translates_every_parameter(params: dict) -> None:
    """docker_run_argv has a form for each key (it refuses one it has not), and each form
    yields words: no parameter reaches the direct launch only."""
    assert params.keys() <= DOCKER_RUN.keys() | set(POSITIONAL)
    for key in params.keys() - set(POSITIONAL) - {"init"}:  # init: false is docker run's own
        assert DOCKER_RUN[key](params[key]), key
    docker_run_argv(params, "42")


@pytest.mark.parametrize(
    ("cpus", "limits"),
    [
        (0.5, (10_000, 5_000)),  # a 10 ms period, not Docker's 100 ms
        (8, (10_000, 80_000)),  # 8 CPUs: 80 ms of CPU time in each 10 ms
        (0.06, (16_667, 1_000)),  # the kernel's least quota, 1 ms: a longer period
        (0.01, (100_000, 1_000)),  # Docker's least --cpus
    ],
)
def test_a_cpu_quota_runs_in_10_ms_periods(cpus: float, limits: tuple[int, int]) -> None:
    assert container.cpu_limits(cpus) == limits
    params = container_params(**ARGS, ipc_host=True, cpus=cpus, gpus=0, devices=[])
    assert (params["cpu_period"], params["cpu_quota"]) == limits
    argv = docker_run_argv(params, "42")
    assert f"--cpu-period={limits[0]}" in argv
    assert f"--cpu-quota={limits[1]}" in argv


def test_every_docker_run_form_is_one_the_builder_makes() -> None:
    assert DOCKER_RUN.keys() | set(POSITIONAL) == every_key()


def test_a_parameter_without_a_docker_run_form_is_refused() -> None:
    with pytest.raises(ValueError, match="no docker run form for the container parameter"):
        docker_run_argv({**built()[0], "oom_killer": False}, "42")


def _docker_container_options() -> set[str]:
    spec = importlib.util.find_spec("ansible_collections.community.docker")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("community.docker is not installed (make venv)")
    module = Path(next(iter(spec.submodule_search_locations)))
    tree = ast.parse((module / "plugins" / "modules" / "docker_container.py").read_text())
    doc = next(
        n.value.value
        for n in tree.body
        if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "DOCUMENTATION"
    )
    options = yaml.safe_load(doc)["options"]
    return set(options) | {a for o in options.values() for a in o.get("aliases", [])}


def test_every_parameter_is_a_docker_container_option() -> None:
    assert every_key() - _docker_container_options() == set()


def test_start_yml_gives_docker_container_every_parameter_under_its_own_name() -> None:
    """The direct launch and relaunch.yml: each parameter the builder makes, none other."""
    start = task(TASKS / "start.yml", "Start the run's container")
    assert start["vars"] == {"__p": "{{ __trainer_run_spec.params }}"}
    options = dict(start["community.docker.docker_container"])
    assert (options.pop("state"), options.pop("detach")) == ("started", True)
    assert options.keys() == every_key()
    for key, value in options.items():
        assert value in (f"{{{{ __p.{key} }}}}", f"{{{{ __p.{key} | default(omit) }}}}"), key


def tasks_of(path: Path) -> list[dict]:
    """Every task of a task file, those in blocks (and their rescue) too."""
    out, todo = [], list(yaml.safe_load(path.read_text()) or [])
    while todo:
        t = todo.pop()
        out.append(t)
        todo += t.get("block", []) + t.get("rescue", []) + t.get("always", [])
    return out


def test_launch_yml_builds_the_parameters_with_the_builder_and_keeps_them() -> None:
    launch = yaml.safe_load((TASKS / "launch.yml").read_text())
    work = task(TASKS / "launch.yml", "Work out the run's container")
    spec = work["ansible.builtin.set_fact"]["__trainer_run_spec"]
    assert spec["params"] == "{{ __trainer_run_container_inputs | ddpfleet_container_params }}"
    wanted = set(inspect.signature(container_params).parameters)
    assert set(work["vars"]["__trainer_run_container_inputs"]) == wanted
    # a registered result of the same name outranks a task's vars: the builder got state.yml's
    # docker_container_info result (its 'changed' key) in a sandbox run
    registered = {t.get("register") for f in TASKS.glob("*.yml") for t in tasks_of(f)}
    assert not set(work["vars"]) & registered
    kept = [
        t for block in launch for t in block.get("block", [])
        if t.get("name") == "Keep the container's parameters"
    ]  # fmt: skip
    assert kept[0]["ansible.builtin.copy"]["content"].startswith("{{ __trainer_run_spec | to_nice")
    assert kept[0]["ansible.builtin.copy"]["dest"] == "{{ _trainer_run_spec_file }}"


def test_relaunch_yml_starts_the_kept_parameters_through_start_yml() -> None:
    read = task(TASKS / "relaunch.yml", "Read the container's kept parameters")
    assert read["ansible.builtin.slurp"]["src"] == "{{ _trainer_run_spec_file }}"
    take = task(TASKS / "relaunch.yml", "Take the kept parameters of the running attempt")
    assert "from_json" in take["ansible.builtin.set_fact"]["__trainer_run_spec"]
    relaunch = task(
        TASKS / "relaunch.yml", "Launch this host's container into the running run again"
    )
    assert {
        "name": "Start the run's container again",
        "ansible.builtin.include_tasks": "start.yml",
    } in relaunch["block"]


@pytest.mark.parametrize("params", built(), ids=list(VARIANTS))
def test_the_kept_parameters_read_back_the_same(params: dict) -> None:
    """launch.yml keeps them as JSON; relaunch.yml and the Slurm task read that back."""
    assert json.loads(json.dumps(params)) == params


def test_the_builder_imports_only_the_standard_library() -> None:
    """The slurm role installs it beside its task program, on hosts without our packages."""
    tree = ast.parse(Path(container.__file__).read_text())
    names = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    names |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
    }
    assert names - set(sys.stdlib_module_names) - {"__future__"} == set()


def test_the_slurm_role_ships_the_builder_s_module_beside_its_task() -> None:
    link = ROOT / "roles" / "slurm" / "files" / "ddpfleet_container.py"
    assert link.resolve() == Path(container.__file__).resolve()
