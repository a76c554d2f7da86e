"""The ddpfleet_tree_hash lookup: the trainer image's content hash over the sources."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleLookupError
from ansible.plugins.loader import lookup_loader
from plugin_loader import load_plugin

PLUGINS = Path(__file__).resolve().parents[2] / "roles/trainer_image/lookup_plugins"
tree_hash_module = load_plugin(
    "ddpfleet_tree_hash", "roles/trainer_image/lookup_plugins/ddpfleet_tree_hash.py"
)
tree_hash = tree_hash_module.tree_hash

SOURCES = ["Dockerfile", "pkg"]


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "Dockerfile").write_text("FROM base\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("X = 1\n")
    (tmp_path / "unrelated.txt").write_text("not hashed\n")
    return tmp_path


def test_hash_is_hex_sha256(tree: Path) -> None:
    digest = tree_hash(tree, SOURCES)
    assert len(digest) == 64
    int(digest, 16)


def test_same_tree_gives_same_hash(tree: Path) -> None:
    assert tree_hash(tree, SOURCES) == tree_hash(tree, list(reversed(SOURCES)))


def test_content_change_changes_hash(tree: Path) -> None:
    before = tree_hash(tree, SOURCES)
    (tree / "pkg" / "sub" / "mod.py").write_text("X = 2\n")
    assert tree_hash(tree, SOURCES) != before


def test_new_file_changes_hash(tree: Path) -> None:
    before = tree_hash(tree, SOURCES)
    (tree / "pkg" / "new.py").write_text("")
    assert tree_hash(tree, SOURCES) != before


def test_rename_changes_hash(tree: Path) -> None:
    before = tree_hash(tree, SOURCES)
    (tree / "pkg" / "sub" / "mod.py").rename(tree / "pkg" / "sub" / "other.py")
    assert tree_hash(tree, SOURCES) != before


def test_executable_bit_changes_hash(tree: Path) -> None:
    before = tree_hash(tree, SOURCES)
    (tree / "pkg" / "sub" / "mod.py").chmod(0o755)
    assert tree_hash(tree, SOURCES) != before


@pytest.mark.parametrize(
    "junk",
    ["pkg/__pycache__/mod.cpython-311.pyc", "pkg/sub/mod.pyc", "pkg/x.egg-info/PKG-INFO"],
)
def test_caches_and_build_metadata_are_ignored(tree: Path, junk: str) -> None:
    before = tree_hash(tree, SOURCES)
    path = tree / junk
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0cache")
    assert tree_hash(tree, SOURCES) == before


def test_files_outside_the_terms_are_ignored(tree: Path) -> None:
    before = tree_hash(tree, SOURCES)
    (tree / "unrelated.txt").write_text("changed\n")
    assert tree_hash(tree, SOURCES) == before


def test_missing_path_is_one_clear_error(tree: Path) -> None:
    with pytest.raises(AnsibleLookupError, match=r"nope is neither a file nor a directory"):
        tree_hash(tree, ["nope"])


def test_no_terms_is_an_error(tree: Path) -> None:
    with pytest.raises(AnsibleLookupError, match="at least one"):
        tree_hash(tree, [])


def _lookup() -> object:
    """The plugin as Ansible loads it (with its documented options)."""
    lookup_loader.add_directory(str(PLUGINS))
    plugin = lookup_loader.get("ddpfleet_tree_hash")
    assert plugin is not None
    return plugin


def test_lookup_plugin_returns_one_digest(tree: Path) -> None:
    lookup = _lookup()
    assert lookup.run(SOURCES, variables={}, root=str(tree)) == [tree_hash(tree, SOURCES)]


def test_lookup_plugin_rejects_missing_root(tmp_path: Path) -> None:
    lookup = _lookup()
    with pytest.raises(AnsibleLookupError, match="is not a directory"):
        lookup.run(SOURCES, variables={}, root=str(tmp_path / "absent"))
