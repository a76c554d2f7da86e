"""The agent's modules import one another without a circle, counting every import a module
holds (under ``if TYPE_CHECKING:`` and inside functions too), and only its entry points import
supervise: the adapters take what they use, not the whole agent."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import ddpfleet_agent

PACKAGE = Path(ddpfleet_agent.__file__).parent
NAMES = {p.stem for p in PACKAGE.glob("*.py")}


def imported(path: Path) -> set[str]:
    """The package's modules that the module at ``path`` imports, wherever in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[1] for a in node.names if a.name.count(".") == 1}
        elif isinstance(node, ast.ImportFrom) and (node.level or node.module):
            module = "ddpfleet_agent." * bool(node.level) + (node.module or "ddpfleet_agent")
            if module == "ddpfleet_agent":
                found |= {a.name for a in node.names}
            elif module.startswith("ddpfleet_agent."):
                found.add(module.split(".")[1])
    return (found & NAMES) - {path.stem}


GRAPH = {p.stem: imported(p) for p in sorted(PACKAGE.glob("*.py"))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One circle through each module that is on one, as the modules along it."""
    found: list[list[str]] = []
    for start in sorted(graph):
        paths = [[start]]
        while paths and not any(start in c for c in found):
            path = paths.pop()
            for nxt in sorted(graph[path[-1]]):
                if nxt == start:
                    found.append([*path, start])
                    break
                if nxt not in path:
                    paths.append([*path, nxt])
    return found


def test_no_module_of_the_agent_is_on_an_import_circle():
    assert cycles(GRAPH) == []


def test_only_the_entry_points_import_supervise():
    assert [m for m, to in GRAPH.items() if "supervise" in to] == ["__main__"]


def test_the_circle_finder_finds_a_circle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_module_sets_an_attribute_of_an_object_it_holds():
    """Each part and adapter changes its own state only: no ``self.peers.members = ...`` (what
    another object should know goes through a method of that object, or is handed back)."""
    found = []
    for path in sorted(PACKAGE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for each in target.elts if isinstance(target, ast.Tuple) else [target]:
                    if isinstance(each, ast.Attribute) and isinstance(each.value, ast.Attribute):
                        found.append(f"{path.name}:{node.lineno}: {ast.unparse(each)}")
    assert found == []


def test_the_attribute_finder_finds_one(tmp_path, monkeypatch):
    part = "class P:\n    def f(self):\n        self.peers.members = []\n"
    (tmp_path / "part.py").write_text(part)
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path)
    with pytest.raises(AssertionError, match=r"part.py:3: self.peers.members"):
        test_no_module_sets_an_attribute_of_an_object_it_holds()
