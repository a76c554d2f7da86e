"""Every train_* option is declared once, in roles/trainer_run/meta/argument_specs.yml (type,
choices, default, description). Checked against it: the role's defaults, the sample inventory
(values and comments), the numeric minimums of the validation, and the trainer's own flags."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin

from trainer.config import get_args_parser

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
ROLE_VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
ALL_SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
SPECS = {k: v for k, v in ALL_SPECS["main"]["options"].items() if k.startswith("train_")}
SAMPLE = ROOT / "inventory" / "sample" / "group_vars" / "all" / "train.yml"
TRAINER_FLAGS = {a.dest: a for a in get_args_parser()._actions if a.dest != "help"}
TYPES = {
    "int": int,
    "float": float,
    "str": str,
    "bool": bool,
    "dict": dict,
    "list": list,
    "raw": object,
}


def _sample() -> dict[str, tuple[object, str]]:
    """{name: (value, the comment above it)} from the sample's `# train_x: value` lines; an
    option right below another one shares that one's comment."""
    found: dict[str, tuple[object, str]] = {}
    comment: list[str] = []
    for line in SAMPLE.read_text().splitlines():
        m = re.match(r"^# (train_\w+): (.*)$", line)
        if m:
            text = " ".join(comment) or (list(found.values())[-1][1] if found else "")
            found[m.group(1)] = (yaml.safe_load(m.group(2)), text)
            comment = []
        elif line.startswith("# ") and not line.startswith("# ---"):
            comment.append(line[2:].strip())
        else:
            comment = []
    return found


SAMPLE_OPTIONS = _sample()


def test_the_typo_guard_reads_the_declarations():
    """vars/main.yml derives _trainer_run_options from meta/argument_specs.yml, not a copy."""
    assert "argument_specs.yml" in ROLE_VARS["_trainer_run_specs"]
    assert "_trainer_run_specs" in ROLE_VARS["_trainer_run_options"]


def test_every_option_is_declared_with_a_type_and_a_description():
    for name, spec in SPECS.items():
        assert spec["type"] in TYPES, name
        assert spec["description"], name


def test_defaults_are_the_declared_defaults():
    assert {name: spec["default"] for name, spec in SPECS.items()} == DEFAULTS
    for name, spec in SPECS.items():
        assert isinstance(DEFAULTS[name], TYPES[spec["type"]]), name


def test_the_defaults_pass_the_role_s_own_checks():
    filters = load_plugin(
        "ddpfleet_run_filters", "roles/trainer_run/filter_plugins/ddpfleet_run_filters.py"
    )
    assert filters.bad_options(DEFAULTS, SPECS, ROLE_VARS["_trainer_run_minimums"]) == []


def test_declared_choices_include_the_default():
    for name, spec in SPECS.items():
        if "choices" in spec:
            assert spec["default"] in spec["choices"], name


def test_sample_inventory_documents_every_option_with_its_default():
    assert {k: v for k, (v, _) in SAMPLE_OPTIONS.items()} == DEFAULTS


@pytest.mark.parametrize("name", sorted(SPECS))
def test_sample_inventory_comment_is_the_declared_description(name):
    described = " ".join(str(SPECS[name]["description"]).split())
    assert SAMPLE_OPTIONS[name][1] == described


@pytest.mark.parametrize("name", sorted(ROLE_VARS["_trainer_run_minimums"]))
def test_numeric_minimums_refer_to_numeric_options(name):
    assert SPECS[name]["type"] in ("int", "float")
    assert DEFAULTS[name] >= ROLE_VARS["_trainer_run_minimums"][name]


def test_every_trainer_flag_has_an_option_and_the_role_passes_it():
    """python -m trainer --<x> is train_<x> (but --output-dir: the run directory, and
    --batch-weights: one weight per rank, which the role works out from train_balance)."""
    passed = set(ROLE_VARS["_trainer_run_trainer_options"])
    assert passed == set(TRAINER_FLAGS)
    derived = {"output_dir", "batch_weights"}
    assert {f"train_{d}" for d in TRAINER_FLAGS if d not in derived} <= set(SPECS)


@pytest.mark.parametrize("dest", sorted(d for d, a in TRAINER_FLAGS.items() if a.choices))
def test_declared_choices_are_the_trainers(dest):
    assert SPECS[f"train_{dest}"]["choices"] == list(TRAINER_FLAGS[dest].choices)
