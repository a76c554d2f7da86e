"""The train_* options are documented once and listed consistently: role defaults, the typo
guard's list, meta/argument_specs.yml and inventory/sample/group_vars/all/train.yml."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
SAMPLE = ROOT / "inventory" / "sample" / "group_vars" / "all" / "train.yml"


def _sample_options() -> dict:
    """The commented `# train_x: value` lines of the sample inventory, parsed."""
    found = {}
    for line in SAMPLE.read_text().splitlines():
        m = re.match(r"^# (train_\w+: .*)$", line)
        if m:
            found.update(yaml.safe_load(m.group(1)))
    return found


def test_every_default_is_a_train_option():
    assert all(name.startswith("train_") for name in DEFAULTS)


def test_typo_guard_lists_exactly_the_defaults():
    assert sorted(ROLE_VARS["_trainer_run_options"]) == sorted(DEFAULTS)


def test_sample_inventory_documents_every_option_with_its_default():
    assert _sample_options() == DEFAULTS


def test_argument_specs_match_the_defaults():
    options = dict(SPECS["main"]["options"])
    options.pop("run_id")
    assert sorted(options) == sorted(DEFAULTS)
    for name, spec in options.items():
        assert spec["default"] == DEFAULTS[name], name
        assert spec["description"], name


@pytest.mark.parametrize("name", sorted(ROLE_VARS["_trainer_run_minimums"]))
def test_numeric_minimums_refer_to_real_options(name):
    assert name in DEFAULTS
    assert isinstance(DEFAULTS[name], (int, float))
    assert DEFAULTS[name] >= ROLE_VARS["_trainer_run_minimums"][name]
