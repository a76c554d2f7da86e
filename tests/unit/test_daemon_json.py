"""The daemon.json merge filter: one owner for the file, foreign keys kept."""

from __future__ import annotations

import json

import pytest
from ansible.errors import AnsibleFilterError
from plugin_loader import load_plugin

daemon_json = load_plugin("ddpfleet_daemon_json", "roles/docker/filter_plugins/daemon_json.py")

MANAGED = {
    "live-restore": True,
    "log-driver": "json-file",
    "log-opts": {"max-file": "5", "max-size": "100m"},
}
NVIDIA = {"runtimes": {"nvidia": {"args": [], "path": "nvidia-container-runtime"}}}


def test_missing_file_gives_managed_keys() -> None:
    assert daemon_json.daemon_json_merge("", MANAGED) == MANAGED


def test_unmanaged_keys_are_kept() -> None:
    existing = json.dumps({"data-root": "/srv/docker", **NVIDIA}, indent=4)
    merged = daemon_json.daemon_json_merge(existing, MANAGED)
    assert merged["data-root"] == "/srv/docker"
    assert merged["runtimes"] == NVIDIA["runtimes"]


def test_managed_keys_override_existing_values() -> None:
    merged = daemon_json.daemon_json_merge('{"live-restore": false}', MANAGED)
    assert merged["live-restore"] is True


def test_nested_mappings_merge_key_by_key() -> None:
    existing = '{"log-opts": {"max-size": "10m", "labels": "io.ddpfleet.run_id"}}'
    merged = daemon_json.daemon_json_merge(existing, MANAGED)
    assert merged["log-opts"] == {
        "labels": "io.ddpfleet.run_id",
        "max-file": "5",
        "max-size": "100m",
    }


def test_none_removes_a_key() -> None:
    merged = daemon_json.daemon_json_merge('{"debug": true, "bip": "10.9.0.1/24"}', {"debug": None})
    assert merged == {"bip": "10.9.0.1/24"}


def test_keys_come_out_sorted_at_every_level() -> None:
    merged = daemon_json.daemon_json_merge('{"z": 1, "a": {"y": 1, "b": 2}}', {"m": {"k": 1}})
    assert list(merged) == ["a", "m", "z"]
    assert list(merged["a"]) == ["b", "y"]


def test_merge_is_idempotent() -> None:
    once = daemon_json.daemon_json_merge(json.dumps(NVIDIA), MANAGED)
    twice = daemon_json.daemon_json_merge(json.dumps(once), MANAGED)
    assert once == twice
    assert json.dumps(once, sort_keys=True) == json.dumps(twice, sort_keys=True)


def test_foreign_formatting_parses_equal() -> None:
    """The role compares meaning, so nvidia-ctk's 4-space indent does not force a rewrite."""
    once = daemon_json.daemon_json_merge("", {**MANAGED, **NVIDIA})
    reformatted = json.dumps(once, indent=4)
    assert daemon_json.daemon_json_parse(reformatted) == once
    assert daemon_json.daemon_json_merge(reformatted, MANAGED) == once


def test_inputs_are_not_mutated() -> None:
    existing = {"log-opts": {"max-size": "1m"}}
    managed = {"log-opts": {"max-file": "2"}}
    daemon_json.daemon_json_merge(existing, managed)
    assert existing == {"log-opts": {"max-size": "1m"}}
    assert managed == {"log-opts": {"max-file": "2"}}


@pytest.mark.parametrize("text", ["", "   \n", None])
def test_parse_empty_is_empty_mapping(text: str | None) -> None:
    assert daemon_json.daemon_json_parse(text) == {}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"live-restore": true,', "not valid JSON (line 1"),
        ("[1, 2]", "must hold a JSON object, found list"),
        ('"text"', "must hold a JSON object, found str"),
    ],
)
def test_bad_file_gives_one_clear_error(text: str, message: str) -> None:
    with pytest.raises(AnsibleFilterError, match=message.replace("(", r"\(")):
        daemon_json.daemon_json_merge(text, MANAGED)


def test_managed_must_be_a_mapping() -> None:
    with pytest.raises(AnsibleFilterError, match="must be a mapping"):
        daemon_json.daemon_json_merge("{}", ["live-restore"])


def test_filters_are_registered_under_their_names() -> None:
    filters = daemon_json.FilterModule().filters()
    assert filters["ddpfleet_daemon_json_merge"] is daemon_json.daemon_json_merge
    assert filters["ddpfleet_daemon_json_parse"] is daemon_json.daemon_json_parse
