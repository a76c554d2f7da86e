"""Each of ddpfleet's own Ansible modules documents itself as `ansible-doc` reads it: its
DOCUMENTATION and RETURN are YAML, and the options they name are the module's argument spec,
with the same types, defaults and required flags (the spec is taken from the module's own
main(), its AnsibleModule stood in for); and no run warns of an option named like a password
without no_log set either way."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType

import pytest
import yaml
from ansible.module_utils.basic import PASSWORD_MATCH
from plugin_loader import ROOT, load_plugin

MODULES = sorted([*ROOT.glob("library/*.py"), *ROOT.glob("roles/*/library/*.py")])


class Spec(Exception):  # raised to carry the spec out of main(), not an error
    def __init__(self, argument_spec: dict):
        super().__init__("argument spec")
        self.argument_spec = argument_spec


class Capture:
    """AnsibleModule's stand-in: it hands its argument spec back instead of reading input."""

    def __init__(self, argument_spec: dict, **_: object):
        raise Spec(argument_spec)


@functools.cache
def loaded(path: Path) -> tuple[ModuleType, dict]:
    """The module, loaded once for every test, and its argument spec."""
    module = load_plugin(f"docs_{path.stem}", str(path.relative_to(ROOT)))
    module.AnsibleModule = Capture
    with pytest.raises(Spec) as caught:
        module.main()
    return module, caught.value.argument_spec


def test_every_module_is_found() -> None:
    assert [m.stem for m in MODULES] == [
        "ddpfleet_files",
        "ddpfleet_host_probe",
        "ddpfleet_registry_image",
        "ddpfleet_run_port_probe",
        "ddpfleet_run_preflight",
    ]


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_the_docs_are_yaml_and_name_the_argument_spec(path: Path) -> None:
    module, spec = loaded(path)
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["module"] == path.stem
    assert isinstance(yaml.safe_load(getattr(module, "RETURN", "") or "{}"), dict)
    options = doc["options"]
    assert sorted(options) == sorted(spec)
    for name, want in spec.items():
        got = options[name]
        assert got.get("type", "str") == want.get("type", "str"), name
        assert got.get("elements") == want.get("elements"), name
        assert bool(got.get("required")) == bool(want.get("required")), name
        assert got.get("default") == want.get("default"), name


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.stem)
def test_an_option_named_like_a_password_says_whether_it_is_logged(path: Path) -> None:
    """AnsibleModule warns on every run of an option whose name matches PASSWORD_MATCH (as
    ddpfleet_host_probe's `passwd`, the path of /etc/passwd) unless no_log is set either way."""
    _, spec = loaded(path)
    unsaid = [n for n, o in spec.items() if PASSWORD_MATCH.search(n) and "no_log" not in o]
    assert unsaid == [], f"{path.stem}: set no_log on {unsaid}"
