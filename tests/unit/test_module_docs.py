"""Each of ddpfleet's own Ansible modules documents itself as `ansible-doc` reads it: its
DOCUMENTATION and RETURN are YAML, and the options they name are the module's argument spec,
with the same types, defaults and required flags (the spec is taken from the module's own
main(), its AnsibleModule stood in for)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest
import yaml
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


def argument_spec(module: ModuleType) -> dict:
    module.AnsibleModule = Capture
    with pytest.raises(Spec) as caught:
        module.main()
    return caught.value.argument_spec


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
    module = load_plugin(f"docs_{path.stem}", str(path.relative_to(ROOT)))
    doc = yaml.safe_load(module.DOCUMENTATION)
    assert doc["module"] == path.stem
    assert isinstance(yaml.safe_load(getattr(module, "RETURN", "") or "{}"), dict)
    spec, options = argument_spec(module), doc["options"]
    assert sorted(options) == sorted(spec)
    for name, want in spec.items():
        got = options[name]
        assert got.get("type", "str") == want.get("type", "str"), name
        assert got.get("elements") == want.get("elements"), name
        assert bool(got.get("required")) == bool(want.get("required")), name
        assert got.get("default") == want.get("default"), name
