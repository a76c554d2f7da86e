"""Unit tests of roles/trainer_run/filter_plugins: train_* options to trainer flags, the
option checks, peers and ulimits."""

from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from plugin_loader import load_plugin

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


@pytest.mark.parametrize(
    ("name", "value", "problem"),
    [
        ("train_batch_size", 8, None),
        ("train_batch_size", "8", None),
        ("train_batch_size", 0, "train_batch_size must be a whole number >= 1 (got 0)"),
        ("train_batch_size", "abc", "train_batch_size must be a whole number >= 1 (got 'abc')"),
        ("train_batch_size", 1.5, "train_batch_size must be a whole number >= 1 (got 1.5)"),
        ("train_batch_size", True, "train_batch_size must be a whole number >= 1 (got True)"),
        ("train_seed", -3, None),
        ("train_seed", None, "train_seed must be a whole number (got None)"),
        ("train_lr", "0.05", None),
        ("train_synthetic", "yes", None),
        ("train_synthetic", "maybe", "train_synthetic must be true or false (got 'maybe')"),
        ("train_amp", "bf16", None),
        ("train_amp", "fast", "train_amp must be one of auto, bf16, fp16, off (got 'fast')"),
        ("train_env", {"NCCL_DEBUG": "INFO"}, None),
        ("train_env", "x", "train_env must be a mapping (got 'x')"),
        ("train_arch", "resnet18", None),
        ("train_lr", "nan", "train_lr must be a finite number (got nan)"),
        ("train_lr", "-Infinity", "train_lr must be a finite number (got -Infinity)"),
        ("train_batch_size", "1e999", "train_batch_size must be a finite number (got 1e999)"),
        ("train_seed", float("inf"), "train_seed must be a finite number (got inf)"),
    ],
)
def test_bad_options_checks_each_value_against_its_declaration(name, value, problem):
    specs = {
        "train_batch_size": {"type": "int"},
        "train_seed": {"type": "int"},
        "train_lr": {"type": "float"},
        "train_synthetic": {"type": "bool"},
        "train_amp": {"type": "str", "choices": ["auto", "bf16", "fp16", "off"]},
        "train_env": {"type": "dict"},
        "train_arch": {"type": "str"},
    }
    minimums = {"train_batch_size": 1, "train_lr": 0.0000001}
    assert filters.bad_options({name: value}, specs, minimums) == ([problem] if problem else [])


def test_peers_need_a_cluster_ip():
    hostvars = {"n1": {"cluster_ip": "10.0.0.1", "node_hostname": "gpu1"}, "n2": {}}
    assert filters.peers(["n1"], hostvars) == [
        {"name": "n1", "hostname": "gpu1", "cluster_ip": "10.0.0.1"}
    ]
    with pytest.raises(AnsibleFilterError, match="n2 has no cluster_ip"):
        filters.peers(["n2"], hostvars)


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
