"""Every train_* option is declared once, in trainer/options.py. Checked here: the declaration
itself (types, ranges, choices, defaults), the files generated from it are current and read back
as declared, and every option refuses bad values in one line naming it (never a traceback)."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin

import trainer.request as validate
from trainer.config import get_args_parser
from trainer.options import OPTIONS, problem

ROOT = Path(__file__).resolve().parents[2]
gen = load_plugin("gen_options", "tools/gen_options.py")
NUMERIC = sorted(n for n, o in OPTIONS.items() if o.type in ("int", "float"))
HOSTS = ["node1", "node2"]
# 0, -1, huge, non-finite and wrong types: each refused in one line or accepted, for every option
PROBES = [0, -1, 1e18, 10**400, math.nan, math.inf, -math.inf, "1e999", {}, {"a": 1}, "abc", [],
          ["x"], None, True, "", " ", "a\nb"]  # fmt: skip


def test_generated_files_are_current():
    assert gen.stale() == [], "run make generate"


def test_a_stale_generated_file_is_found(tmp_path):
    for path in gen.FILES:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    (tmp_path / gen.DEFAULTS).write_text("---\ntrain_epochs: 2\n")
    assert gen.stale(tmp_path) == [gen.DEFAULTS]


def test_role_defaults_read_back_as_declared():
    defaults = yaml.safe_load((ROOT / gen.DEFAULTS).read_text())
    assert defaults == {name: o.default for name, o in OPTIONS.items()}


def test_sample_inventory_reads_back_as_declared():
    lines = (ROOT / gen.SAMPLE).read_text().splitlines()
    sample = yaml.safe_load("\n".join(line[2:] for line in lines if line.startswith("# train_")))
    assert sample == {name: o.default for name, o in OPTIONS.items()}


def test_argument_specs_read_back_as_declared():
    specs = yaml.safe_load((ROOT / gen.SPECS).read_text())["argument_specs"]["main"]["options"]
    declared = {n: (o.type, o.default, list(o.choices)) for n, o in OPTIONS.items()}
    read = {
        n: (s["type"], s["default"], s.get("choices", []))
        for n, s in specs.items()
        if n != "run_id"
    }
    assert read == declared


@pytest.mark.parametrize("name", NUMERIC)
def test_every_numeric_option_has_a_range_around_its_default(name):
    option = OPTIONS[name]
    assert option.min is not None
    assert option.max is not None
    assert option.min <= option.default <= option.max


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_the_default_passes_its_own_declaration(name):
    assert problem(name, OPTIONS[name].default) == ""
    assert OPTIONS[name].help


@pytest.mark.parametrize("name", sorted(n for n, o in OPTIONS.items() if o.flag))
def test_the_trainer_reads_its_flag_from_the_declaration(name):
    option = OPTIONS[name]
    action = next(a for a in get_args_parser()._actions if option.flag in a.option_strings)
    assert action.default == option.trainer_default
    assert list(action.choices or []) == list(option.choices)


def test_a_huge_timeout_is_refused_in_one_line():
    assert problem("train_peer_timeout", 1e10) == (
        "train_peer_timeout must be a whole number from 5 to 604800 (got 10000000000.0)"
    )


@pytest.mark.parametrize("value", PROBES, ids=repr)
@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_every_option_refuses_a_bad_value_in_one_line_or_accepts_it(name, value):
    """Through the whole validation (the rules across options run on accepted values)."""
    variables = {"run_id": "r1", "shared_mount": "/mnt/ddpfleet", "train_synthetic": True,
                 name: value}  # fmt: skip
    hostvars = {h: {} for h in HOSTS}
    found = validate.first_problem(variables, HOSTS, HOSTS, hostvars)
    assert "\n" not in found
    assert found == "" or name in found, found
