"""tools/install_collections.py on wheels laid out as the `ansible` package's: only the listed
collections are extracted, a second run writes nothing, a new version replaces the old one
whole, and a bad list or archive is one line before anything is written. The real wheel is
checked against collections.txt where `make venv` has installed it (the unit tier's venv)."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import install_collections as tool  # noqa: E402 - tools/ is no package


def fake_wheel(
    path: Path, collections: dict[str, str], extra: dict[str, str] | None = None
) -> Path:
    with zipfile.ZipFile(path, "w") as z:
        for name, version in collections.items():
            ns, coll = name.split(".")
            info = {"collection_info": {"namespace": ns, "name": coll, "version": version}}
            z.writestr(f"ansible_collections/{ns}/{coll}/MANIFEST.json", json.dumps(info))
            z.writestr(f"ansible_collections/{ns}/{coll}/plugins/modules/m.py", f"# {version}\n")
        for member, text in (extra or {}).items():
            z.writestr(member, text)
    return path


def test_only_the_listed_collections_are_extracted_and_a_rerun_writes_nothing(tmp_path: Path):
    archive = fake_wheel(tmp_path / "a.whl", {"community.docker": "4.8.5", "cisco.ios": "9.0.0"})
    dest = tmp_path / "site"
    with zipfile.ZipFile(archive) as z:
        assert tool.extract(z, "community.docker", dest) == "4.8.5"
        module = dest / "ansible_collections/community/docker/plugins/modules/m.py"
        first = module.stat().st_mtime_ns
        assert tool.extract(z, "community.docker", dest) == "4.8.5"
    assert module.stat().st_mtime_ns == first
    assert not (dest / "ansible_collections" / "cisco").exists()


def test_a_new_version_replaces_the_old_directory_whole(tmp_path: Path):
    dest = tmp_path / "site"
    with zipfile.ZipFile(fake_wheel(tmp_path / "old.whl", {"ansible.posix": "2.0.0"})) as z:
        tool.extract(z, "ansible.posix", dest)
    stray = dest / "ansible_collections/ansible/posix/plugins/modules/gone.py"
    stray.write_text("# a module the new version dropped\n")
    with zipfile.ZipFile(fake_wheel(tmp_path / "new.whl", {"ansible.posix": "2.1.0"})) as z:
        assert tool.extract(z, "ansible.posix", dest) == "2.1.0"
    assert not stray.exists()
    assert tool.installed_version(dest / "ansible_collections/ansible/posix") == "2.1.0"


def test_a_collection_missing_or_leaving_its_directory_is_refused(tmp_path: Path):
    escaping = {"ansible_collections/evil/x/../../../../outside.txt": "x"}
    archive = fake_wheel(tmp_path / "a.whl", {"evil.x": "1.0.0"}, escaping)
    with zipfile.ZipFile(archive) as z:
        with pytest.raises(SystemExit, match="leaves its directory"):
            tool.extract(z, "evil.x", tmp_path / "site")
        with pytest.raises(SystemExit, match=r"has no collection community\.general"):
            tool.extract(z, "community.general", tmp_path / "site")
    assert not (tmp_path / "site").exists()
    assert not (tmp_path / "outside.txt").exists()


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("community.docker\n", "one ansible==VERSION line"),
        ("ansible==12.3.0\n", "one ansible==VERSION line"),
        ("ansible==12.3.0\ncommunity\n", "'community' is not a collection name"),
        ("ansible==12.3.0\ncommunity.dock-er\n", "is not a collection name"),
    ],
)
def test_a_bad_list_is_one_line(tmp_path: Path, text: str, error: str):
    listing = tmp_path / "collections.txt"
    listing.write_text(text)
    with pytest.raises(SystemExit, match=error):
        tool.read_list(listing)


def test_collections_txt_is_what_the_venv_has():
    """Every collection of collections.txt is in the venv at its release's version, and every
    collection the roles name is in the list (a module of another would fail at run time)."""
    pin, names = tool.read_list(ROOT / "collections.txt")
    site = Path(tool.sysconfig.get_paths()["purelib"]) / "ansible_collections"
    for name in names:
        assert tool.installed_version(site / name.replace(".", "/")), f"{name} not installed"
    used = set()
    for path in [*ROOT.glob("*.yml"), *ROOT.glob("roles/*/*/*.yml")]:
        for word in path.read_text().split():
            parts = word.strip("'\":{}").split(".")
            if len(parts) == 3 and parts[0] in ("community", "ansible") and parts[1] != "builtin":
                used.add(".".join(parts[:2]))
    assert used, "no collection found in the playbooks"
    assert used <= set(names), used - set(names)
    assert pin.startswith("ansible==")
