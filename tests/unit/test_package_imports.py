"""The wheel's three packages import one way: ddpfleet_doctor may import trainer, trainer
nothing of ddpfleet_doctor, ddpfleet_agent neither of them (train.yml ships it as it is into any
image for a user's program). Read from the sources, lazy imports inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def imported_packages(package: str) -> dict[str, set[str]]:
    """{top-level package imported: the package's files that import it} (absolute imports)."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                found.setdefault(name.split(".")[0], set()).add(str(path.relative_to(ROOT)))
    return found


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
