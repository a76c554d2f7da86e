"""The wheel's three packages import one way: ddpfleet_doctor may import trainer, trainer
nothing of ddpfleet_doctor, ddpfleet_agent neither of them (train.yml ships it as it is into any
image for a user's program). Read from the sources, lazy imports inside functions included."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(package: str) -> dict[str, set[str]]:
    """{top-level package imported: the package's files that import it} (absolute imports)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for name in top_level_imports(path):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def top_level_imports(path: Path) -> set[str]:
    """The top-level names a file imports absolutely (``os`` for ``import os.path``)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("trainer", {"ddpfleet_doctor"}),
        ("ddpfleet_agent", {"trainer", "ddpfleet_doctor"}),
    ],
)
def test_a_package_does_not_import_the_ones_above_it(package: str, forbidden: set[str]) -> None:
    imports = imported_packages(package)
    assert imports, f"no imports found under {package}/"
    assert {name: imports[name] for name in forbidden & imports.keys()} == {}


def test_module_utils_import_only_the_standard_library() -> None:
    """The roles' module_utils (some are links to ddpfleet_doctor's files) travel with a module
    to hosts that have neither the packages nor anything but Python: one import of ours there
    would fail only on a real host, where ansible-playbook runs the module."""
    files = sorted(ROOT.glob("roles/*/module_utils/*.py"))
    assert files, "no module_utils found"
    outside = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in files
        if (bad := top_level_imports(path) - set(sys.stdlib_module_names) - {"__future__"})
    }
    assert outside == {}
