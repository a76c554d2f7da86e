"""Unit tests of roles/trainer_run/filter_plugins: train_* options to trainer flags, checks,
and status.yml's report."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from plugin_loader import load_plugin

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"

filters = load_plugin(
    "ddpfleet_run_filters", "roles/trainer_run/filter_plugins/ddpfleet_run_filters.py"
)


def test_trainer_args_maps_names_to_flags():
    args = filters.trainer_args({"batch_size": 8, "max_steps": "30", "lr": 0.05})
    assert args == ["--batch-size", "8", "--lr", "0.05", "--max-steps", "30"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, ["--synthetic"]), ("true", ["--synthetic"]), (False, []), ("no", [])],
)
def test_store_true_switch(value, expected):
    assert filters.trainer_args({"synthetic": value}) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(True, ["--channels-last"]), ("false", ["--no-channels-last"])]
)
def test_boolean_optional_switch(value, expected):
    assert filters.trainer_args({"channels_last": value}) == expected


def test_empty_values_leave_the_trainer_default():
    assert filters.trainer_args({"data_dir": "", "arch": None}) == []


def test_non_scalar_option_is_refused():
    with pytest.raises(AnsibleFilterError, match="train_batch_size must be a scalar"):
        filters.trainer_args({"batch_size": [1, 2]})


def test_trainer_accepts_every_flag_the_role_generates():
    """The flags the role builds from its defaults parse with the trainer's own parser."""
    from trainer.config import get_args_parser  # noqa: PLC0415 - needs the trainer package

    options = {
        "data_dir": "",
        "synthetic": True,
        "synthetic_size": 64,
        "num_classes": 10,
        "image_size": 32,
        "workers": 0,
        "arch": "resnet50",
        "batch_size": 2,
        "epochs": 1,
        "max_steps": 3,
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 0.0001,
        "label_smoothing": 0.1,
        "warmup_epochs": 1.0,
        "lr_decay": "cosine",
        "seed": 0,
        "amp": "auto",
        "channels_last": False,
        "compile": False,
        "throughput_warmup": 3,
        "checkpoint_every": 10,
        "keep_checkpoints": 2,
        "resume": "auto",
        "log_every": 10,
        "dist_timeout": 600,
        "output_dir": "/tmp/x",
    }
    ns = get_args_parser().parse_args(filters.trainer_args(options))
    assert ns.synthetic is True
    assert ns.channels_last is False
    assert ns.max_steps == 3
    assert ns.output_dir == "/tmp/x"


def test_role_trainer_options_cover_every_trainer_flag():
    """Every trainer option is reachable through a train_* variable."""
    import yaml  # noqa: PLC0415

    from trainer.config import get_args_parser  # noqa: PLC0415

    role_vars = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
    mapped = set(role_vars["_trainer_run_trainer_options"])
    flags = {a.dest for a in get_args_parser()._actions if a.dest != "help"}
    assert flags == mapped


def test_unknown_options_lists_only_undocumented_names():
    known = ["train_batch_size", "train_epochs"]
    got = filters.unknown_options(["train_epochs", "train_bach_size", "train_x"], known)
    assert got == ["train_bach_size", "train_x"]


@pytest.mark.parametrize(
    ("value", "ok"), [(1, True), ("8", True), (0, False), ("abc", False), (None, False)]
)
def test_bad_numbers(value, ok):
    problems = filters.bad_numbers({"train_batch_size": value}, {"train_batch_size": 1})
    assert (problems == []) is ok
    if not ok:
        assert problems[0].startswith("train_batch_size must be a number >= 1")


@pytest.mark.parametrize(("value", "ok"), [(True, True), ("yes", True), ("maybe", False)])
def test_bad_bools(value, ok):
    assert (filters.bad_bools({"train_synthetic": value}) == []) is ok


def test_peers_need_a_cluster_ip():
    hostvars = {"n1": {"cluster_ip": "10.0.0.1", "node_hostname": "gpu1"}, "n2": {}}
    assert filters.peers(["n1"], hostvars) == [
        {"name": "n1", "hostname": "gpu1", "cluster_ip": "10.0.0.1"}
    ]
    with pytest.raises(AnsibleFilterError, match="n2 has no cluster_ip"):
        filters.peers(["n2"], hostvars)


def test_status_lines_show_each_host_heartbeats_and_summary():
    hostvars = {
        "n1": {
            "__trainer_run_state": {
                "running": True,
                "containers": [{"name": "ddpfleet-r-n1", "state": "running", "exit_code": None}],
                "heartbeats": [{"rank": 0, "step": 12, "age_sec": 0.4}],
                "exit": "",
                "summary": {},
                "last_metrics": {"step": 10, "loss": 6.8},
            }
        },
        "n2": {
            "__trainer_run_state": {
                "running": False,
                "containers": [{"name": "ddpfleet-r-n2", "state": "exited", "exit_code": 137}],
                "heartbeats": [],
                "exit": json.dumps({"exit_code": 137}),
            }
        },
    }
    lines = filters.status_lines(["n1", "n2"], hostvars, "r", "n1")
    assert lines[0] == "run r: running"
    assert lines[1] == "n1: container running"
    assert lines[2] == "  rank 0: step 12, heartbeat 0.4 s ago"
    assert lines[3] == "n2: container exited (exit code 137); launcher exit code 137"
    assert lines[-1] == "last metrics: loss 6.8, step 10"


def test_status_lines_of_a_finished_run_use_the_summary():
    hostvars = {"n1": {"__trainer_run_state": {"summary": {"status": "failed", "cause": "x"}}}}
    lines = filters.status_lines(["n1"], hostvars, "r", "n1")
    assert lines[0] == "run r: failed"
    assert lines[1] == "n1: container absent"
    assert "cause: x" in lines


def test_launch_wrapper_is_posix_sh():
    """dash (Debian's /bin/sh, the image's) parses the wrapper."""
    dash = "/bin/dash" if Path("/bin/dash").exists() else "/bin/sh"
    subprocess.run([dash, "-n", str(ROLE / "files" / "launch.sh")], check=True)


def test_outcomes_count_a_missing_result_as_failed():
    hostvars = {
        "n1": {"__trainer_run_supervise": {"outcome": "completed"}},
        "n2": {"__trainer_run_supervise": {"failed": True, "msg": "module crashed"}},
        "n3": {},
    }
    assert filters.outcomes(["n1", "n2", "n3"], hostvars) == {
        "n1": "completed",
        "n2": "failed",
        "n3": "failed",
    }


@pytest.mark.parametrize(
    ("granted", "expected"),
    [
        ({}, ["memlock:-1:-1", "stack:67108864:67108864"]),
        ({"memlock": -1, "stack": -1}, ["memlock:-1:-1", "stack:67108864:67108864"]),
        ({"memlock": 8388608, "stack": -1}, ["memlock:8388608:8388608", "stack:67108864:67108864"]),
        ({"memlock": 65536, "stack": 8388608}, ["memlock:65536:65536", "stack:8388608:8388608"]),
    ],
)
def test_ulimits_are_capped_to_what_the_engine_grants(granted, expected):
    assert filters.ulimits({"memlock": -1, "stack": 67108864}, granted) == expected
