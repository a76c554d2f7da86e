"""Unit tests of trainer/shares.py, what train.yml's balance filters are (train_balance's mode,
the doctor's figures for a run, the trainer's --batch-weights), and of the train_balance and
train_cpus checks of trainer/request.py."""

from __future__ import annotations

import base64
import json

import pytest

import trainer.request as validate
from trainer import shares as balance

HOSTS = ["node1", "node2", "node3"]
MODEL = {"arch": "resnet18", "image_size": 64, "batch_size": 16, "amp": "auto"}


@pytest.mark.parametrize(
    ("value", "mode"),
    [("off", "off"), (False, "off"), ("", "off"), ("auto", "auto"), ("AUTO", "auto"), ({}, "map")],
)
def test_balance_modes(value, mode):
    assert balance.balance_mode(value) == mode


def test_a_full_map_of_positive_weights_is_accepted():
    assert validate.balance_problems({"node1": 3, "node2": "2.5", "node3": 1}, HOSTS) == []
    assert validate.balance_problems("auto", HOSTS) == []


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (
            {"node1": 1, "node2": 1, "node3": 0},
            "weight of node3 must be a finite number > 0 (got 0)",
        ),
        ({"node1": 1, "node2": 1, "node3": -2}, "weight of node3 must be a finite number > 0"),
        ({"node1": 1, "node2": 1, "node3": "nan"}, "weight of node3 must be a finite number > 0"),
        ({"node1": 1, "node2": 1, "node3": "inf"}, "weight of node3 must be a finite number > 0"),
        ({"node1": 1, "node2": 1, "node3": "fast"}, "weight of node3 must be a finite number > 0"),
        ({"node1": 1, "node2": 1, "node3": True}, "weight of node3 must be a finite number > 0"),
        ({"node1": 1, "node2": 1}, "gives no weight for node3 (weigh every trainer)"),
        (
            {"node1": 1, "node2": 1, "node3": 1, "node9": 1},
            "names node9, not in the trainers group",
        ),
        ("fast", "train_balance must be off, auto or a mapping"),
        ([1, 2, 3], "train_balance must be off, auto or a mapping"),
    ],
)
def test_bad_balance_is_refused_in_words(value, problem):
    problems = validate.balance_problems(value, HOSTS)
    assert len(problems) == 1
    assert problem in problems[0]


def test_cpus_checks_each_trainer():
    hostvars = {"node1": {}, "node2": {"train_cpus": 0.5}, "node3": {"train_cpus": "inf"}}
    assert validate.cpus_problems(hostvars, HOSTS) == [
        "train_cpus of node3 must be a finite number from 0 to 4096 (got 'inf')"
    ]
    hostvars["node3"] = {"train_cpus": -1}
    assert validate.cpus_problems(hostvars, HOSTS)[0].startswith("train_cpus of node3 must be")
    hostvars["node3"] = {"train_cpus": 5000}
    assert validate.cpus_problems(hostvars, HOSTS)[0].startswith("train_cpus of node3 must be")
    hostvars["node3"] = {"train_cpus": 3}
    assert validate.cpus_problems(hostvars, HOSTS) == []


def _record(path, speeds, **model):
    """A slurp result of a doctor JSON file."""
    hosts = {h: {"compute": {"images_per_sec": s}} for h, s in speeds.items()}
    requested = MODEL | model
    resolved = requested | {"amp": "bf16", "batch_size": requested["batch_size"] or 32}
    doc = {"time": "t", "model": resolved | {"requested": requested}, "hosts": hosts}
    return {"item": path, "content": base64.b64encode(json.dumps(doc).encode()).decode()}


def test_doctor_speeds_take_the_newest_record_of_this_model_on_every_trainer():
    records = [
        _record("d/20261123T100000Z.json", {"node1": 10, "node2": 10, "node3": 5}),
        _record("d/20261123T120000Z.json", {"node1": 30, "node2": 30, "node3": 10}),
        # newer, but another image size, or a trainer missing, or a failed measurement
        _record("d/20261123T130000Z.json", {"node1": 1, "node2": 1, "node3": 1}, image_size=224),
        _record("d/20261123T140000Z.json", {"node1": 9, "node2": 9}),
        _record("d/20261123T150000Z.json", {"node1": 9, "node2": 9, "node3": None}),
        {"item": "d/20261123T160000Z.json", "content": base64.b64encode(b"{not json").decode()},
    ]
    found = balance.doctor_speeds(records, HOSTS, MODEL)
    assert found == {
        "source": "d/20261123T120000Z.json",
        "speeds": {"node1": 30.0, "node2": 30.0, "node3": 10.0},
    }
    # matched as asked for: amp auto (the record resolved it to bf16), not bf16
    assert balance.doctor_speeds(records, HOSTS, MODEL | {"amp": "bf16"}) == {}
    assert balance.doctor_speeds([], HOSTS, MODEL) == {}


def test_rank_weights_share_each_hosts_weight_among_its_processes():
    speeds = {"node1": 30.0, "node2": 30.0, "node3": 10.0}
    assert balance.rank_weights(speeds, HOSTS, 1) == "1,1,0.3333"
    assert balance.rank_weights(speeds, HOSTS, 2) == "1,1,1,1,0.3333,0.3333"
    # node rank order is the run's, not the mapping's
    assert balance.rank_weights(speeds, ["node3", "node1", "node2"], 1) == "0.3333,1,1"


def test_equal_weights_mean_no_weighting():
    assert balance.rank_weights({"node1": 7, "node2": 7.0, "node3": "7"}, HOSTS, 4) == ""


def test_rank_weights_refuse_a_host_without_a_weight():
    with pytest.raises(ValueError, match="no usable weight for node3"):
        balance.rank_weights({"node1": 1, "node2": 1}, HOSTS, 1)
