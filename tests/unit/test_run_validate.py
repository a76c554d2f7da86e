"""The checks of a run request (trainer/request.py),
called in-process; one playbook run proves tasks/validate.yml runs them before anything else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from time_bounds import within

import trainer.request as validate

ROOT = Path(__file__).resolve().parents[2]
TRAINERS = ["gpu1", "gpu2", "gpu3"]
MOUNT = "/mnt/ddpfleet"


def check(**variables: object) -> str:
    """The first problem of a request on the sample inventory's trainers (run_id r1)."""
    request = {"run_id": "r1", "shared_mount": MOUNT, **variables}
    return validate.first_problem(request, TRAINERS, TRAINERS, {h: {} for h in TRAINERS})


def test_run_id_is_required():
    assert validate.run_id_problem(validate.UNDEFINED).startswith("run_id is required: add -e")


@pytest.mark.parametrize(
    "run_id", ["abc\n", "abc\nx", "bad/id", "..", ".", "", "a" * 65, "../../etc", ".preflight-x",
               ".x", "-x", "_x", "a b"],
)  # fmt: skip
def test_bad_run_id_is_refused(run_id):
    assert validate.run_id_problem(run_id) == (
        f"invalid run_id {json.dumps(run_id)}: use 1-64 letters, digits, -, _ or ., starting "
        "with a letter or digit"
    )


@pytest.mark.parametrize(("dump", "problem"), [
    (True, ""), ("false", ""), ("yes", ""),
    ("maybe", 'invalid dump "maybe": use -e dump=true, or leave it out'),
])  # fmt: skip
def test_dump_is_a_boolean(dump, problem):
    assert validate.dump_problem(dump) == problem
    if problem:  # refused before any train_* option is looked at
        assert check(dump=dump, train_synthetic=True) == problem


@pytest.mark.parametrize("run_id", ["r-42_a.b", "a", "9", "a" * 64, "x..y", 42])
def test_good_run_id_passes(run_id):
    assert validate.run_id_problem(run_id) == ""


def test_an_unknown_train_option_is_refused():
    assert check(train_synthetic=True, train_bach_size=8, train_zzz=1) == (
        "unknown train option(s) train_bach_size, train_zzz; "
        "known: see inventory/sample/group_vars/all/train.yml"
    )


@pytest.mark.parametrize(
    ("option", "value"),
    [("train_lr", "nan"), ("train_heartbeat_timeout", "inf"), ("train_workers", "-Infinity"),
     ("train_warmup_epochs", "1e999"), ("train_stop_timeout", "NaN")],
)  # fmt: skip
def test_non_finite_number_is_refused(option, value):
    assert check(**{"train_synthetic": True, option: value}) == (
        f"{option} must be a finite number (got {value})"
    )


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("train_batch_size", 70000, "train_batch_size must be a whole number from 0 to 65536"),
        ("train_batch_size", "abc", "train_batch_size must be a whole number from 0 to 65536"),
        ("train_batch_size", 1.5, "train_batch_size must be a whole number from 0 to 65536"),
        ("train_batch_size", True, "train_batch_size must be a whole number from 0 to 65536"),
        ("train_master_port", 70000, "train_master_port must be a whole number from 1 to 65535"),
        ("train_seed", None, "train_seed must be a whole number from 0 to 4294967295"),
        ("train_lr", 0, "train_lr must be a number from 1e-07 to 1e+30 (got 0)"),
        ("train_synthetic", "maybe", "train_synthetic must be true or false (got 'maybe')"),
        ("train_amp", "fast", "train_amp must be one of auto, bf16, fp16, off (got 'fast')"),
        ("train_env", "x", "train_env must be a mapping (got 'x')"),
        ("train_arch", {}, "train_arch must be a string (got {})"),
        ("train_program_args", "--epochs 3", "train_program_args must be a list of strings"),
    ],
)
def test_a_value_outside_its_declaration_is_refused(option, value, message):
    assert check(**{"train_synthetic": True, option: value}).startswith(message)


@pytest.mark.parametrize(
    ("option", "value"),
    [("train_batch_size", "8"), ("train_lr", "0.05"), ("train_synthetic", "yes"),
     ("train_amp", "bf16"), ("train_env", {"NCCL_DEBUG": "INFO"}),
     ("train_heartbeat_timeout", 600)],
)  # fmt: skip
def test_a_value_inside_its_declaration_passes(option, value):
    assert check(**{"train_synthetic": True, option: value}) == ""


def test_several_bad_values_are_named_together():
    assert check(train_synthetic=True, train_epochs=0, train_lr="nan") == (
        "train_epochs must be a whole number from 1 to 100000 (got 0); "
        "train_lr must be a finite number (got nan)"
    )


def test_limit_that_leaves_trainers_out_is_refused():
    assert validate.limit_problem(TRAINERS, ["gpu1"]).startswith(
        "a run spans every host of the trainers group, and --limit leaves out gpu2, gpu3: "
        "drop --limit"
    )


@pytest.mark.parametrize(
    "data",
    [{}, {"train_synthetic": True, "train_data_dir": "imagenet"}],
)
def test_exactly_one_data_source_is_needed(data):
    assert check(**data) == (
        "give exactly one of train_data_dir=<dir under /mnt/ddpfleet/datasets> "
        "or train_synthetic=true"
    )


@pytest.mark.parametrize(
    "data_dir",
    ["../../../etc", "a/../../..", "/etc", "/mnt/ddpfleet/../etc", "/mnt/ddpfleet/runs/x", ".."],
)
def test_data_dir_outside_shared_storage_is_refused(data_dir):
    assert check(train_data_dir=data_dir) == (
        f"train_data_dir {data_dir} is not under /mnt/ddpfleet/datasets "
        "(the only data the run containers see, read-only)"
    )


@pytest.mark.parametrize("data_dir", ["imagenet/../imagenet-mini", "/mnt/ddpfleet/datasets/x"])
def test_data_dir_on_shared_storage_passes(data_dir):
    assert check(train_data_dir=data_dir) == ""


def test_a_user_program_needs_no_data_source():
    assert check(train_program="/opt/train.py") == ""


def test_master_host_must_be_a_trainer():
    assert check(train_synthetic=True, train_master_host="gpu9") == (
        "train_master_host gpu9 is not in the trainers group"
    )


@pytest.mark.parametrize(
    ("master", "agent", "shown"),
    [(29500, 29500, "29500"), (65535, 0, "65536"), (1000, "1000", "1000")],
)
def test_the_two_ports_must_differ_and_fit(master, agent, shown):
    found = check(train_synthetic=True, train_master_port=master, train_agent_port=agent)
    assert found == (
        f"train_master_port {master} and the agent port {shown} must be two different ports "
        "up to 65535 (train_agent_port 0 means train_master_port + 1)"
    )


@pytest.mark.parametrize(
    ("master", "agent", "metrics", "shown"),
    [(29500, 0, 29501, "29501"), (29500, 0, 29500, "29500"), (65534, 65533, 0, "65536")],
)
def test_the_metrics_port_must_differ_from_both_and_fit(master, agent, metrics, shown):
    found = check(
        train_synthetic=True,
        train_master_port=master,
        train_agent_port=agent,
        train_metrics_port=metrics,
    )
    assert found == (
        f"the metrics port {shown} must differ from train_master_port {master} and the agent "
        f"port {agent or master + 1}, up to 65535 (train_metrics_port 0 means "
        "train_master_port + 2)"
    )
    assert check(train_synthetic=True, train_master_port=master, train_metrics_port=9100) == ""


def test_a_value_with_a_line_break_is_shown_on_one_line():
    assert check(train_synthetic=True, train_master_host="a\nb") == (
        "train_master_host a\\nb is not in the trainers group"
    )


@pytest.mark.parametrize(("values", "problem"), [
    ({"train_min_hosts": 4}, "train_min_hosts 4 is more than the run's 3 trainer(s)"),
    ({"train_min_hosts": "4"}, "train_min_hosts 4 is more than the run's 3 trainer(s)"),
    ({"train_min_hosts": 2, "train_restarts": 0},
     "train_min_hosts 2 needs train_restarts of 1 or more (it is 0)"),
])  # fmt: skip
def test_min_hosts_is_checked_against_the_trainers_and_restarts(values, problem):
    assert check(train_synthetic=True, **values) == problem


@pytest.mark.parametrize("hosts", [0, 2, 3, "2"])  # "2": what -e train_min_hosts=2 gives
def test_min_hosts_within_the_trainers_passes(hosts):
    assert check(train_synthetic=True, train_min_hosts=hosts) == ""


@pytest.mark.parametrize("hosts", [0, "0"])
def test_no_shrinking_needs_no_restarts(hosts):
    """The default (every trainer) with restarts off: today's behaviour, no refusal."""
    assert check(train_synthetic=True, train_min_hosts=hosts, train_restarts="0") == ""


def test_balance_with_a_user_program_is_refused():
    assert check(train_program="pkg.run", train_balance="auto") == (
        "train_balance needs ddpfleet's trainer: a user's program (train_program) splits its "
        "own batches"
    )


@pytest.mark.parametrize(("values", "problem"), [
    ({"train_scheduler": "slurm"}, "train_scheduler=slurm needs the Slurm cluster site.yml "
     "makes: set slurm_enabled: true in the inventory and run site.yml"),
    ({"train_scheduler": "slurm", "slurm_enabled": "false"}, "train_scheduler=slurm needs"),
    ({"train_scheduler": "queue"}, "train_scheduler must be one of direct, slurm (got 'queue')"),
    ({"train_time_limit": 30}, "train_time_limit applies to train_scheduler=slurm only"),
    ({"train_partition": "gpu"}, "train_partition applies to train_scheduler=slurm only"),
    ({"train_scheduler": "slurm", "slurm_enabled": True, "train_time_limit": -1},
     "train_time_limit must be a whole number from 0 to 527040 (got -1)"),
])  # fmt: skip
def test_the_scheduler_options_are_checked(values, problem):
    assert check(train_synthetic=True, **values).startswith(problem)


@pytest.mark.parametrize("values", [
    {},
    {"train_time_limit": "0", "train_partition": ""},
    {"train_scheduler": "slurm", "slurm_enabled": True, "train_time_limit": 90},
    {"train_scheduler": "slurm", "slurm_enabled": "true", "train_partition": "gpu"},
])  # fmt: skip
def test_good_scheduler_options_pass(values):
    assert check(train_synthetic=True, **values) == ""


def test_validate_yml_fails_the_play_in_one_line_before_any_host_is_contacted():
    """The one playbook run: train.yml's first task is the plugin (the sample's hosts do not
    exist, so reaching any of them would say UNREACHABLE)."""
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    playbook = Path(sys.executable).with_name("ansible-playbook")
    extra = json.dumps({"run_id": "r1", "train_synthetic": True, "train_peer_timeout": 1e10})
    proc = subprocess.run(
        [str(playbook), "-i", "inventory/sample/hosts.yml", "train.yml", "-e", extra],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=within(120), check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    line = "train_peer_timeout must be a whole number from 5 to 604800 (got 10000000000.0)"
    assert f'"msg": "{line}"' in proc.stdout, proc.stdout[-2000:]
    assert "UNREACHABLE" not in proc.stdout
