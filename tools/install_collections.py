"""Install the Ansible collections of collections.txt into the venv's site-packages
(ansible.cfg's collections_path), taken from the pinned release of the `ansible` package.

``python tools/install_collections.py [collections.txt]``, run by ``make venv`` with the venv's
Python. The release's wheel comes from the package index pip is configured for (``pip
download``, cached in .cache/wheels); only the listed collections' files are extracted, each
into a fresh directory, and each one's MANIFEST.json must name it with a version. Run again
with nothing changed, it downloads and writes nothing.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "wheels"


def read_list(path: Path) -> tuple[str, list[str]]:
    """(the ``ansible==X`` pin, the collection names) of a collections.txt."""
    lines = [line.split("#", 1)[0].strip() for line in path.read_text().splitlines()]
    lines = [line for line in lines if line]
    pins = [line for line in lines if line.startswith("ansible==")]
    names = [line for line in lines if not line.startswith("ansible==")]
    if len(pins) != 1 or not names:
        raise SystemExit(f"{path}: give one ansible==VERSION line and the collections to take")
    for name in names:
        if name.count(".") != 1 or not all(part.isidentifier() for part in name.split(".")):
            raise SystemExit(f"{path}: {name!r} is not a collection name (namespace.name)")
    return pins[0], names


def wheel(pin: str) -> Path:
    version = pin.split("==", 1)[1]
    found = CACHE / f"ansible-{version}-py3-none-any.whl"
    if not found.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                        "--dest", str(CACHE), pin], check=True)  # fmt: skip
    if not found.exists():
        raise SystemExit(f"pip download {pin} did not give {found.name}")
    return found


def installed_version(target: Path) -> str | None:
    try:
        return json.loads((target / "MANIFEST.json").read_text())["collection_info"]["version"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def extract(archive: zipfile.ZipFile, name: str, dest: Path) -> str:
    """Extract collection ``name`` into dest/ansible_collections/<ns>/<name>; its version."""
    prefix = "ansible_collections/" + name.replace(".", "/") + "/"
    members = [m for m in archive.namelist() if m.startswith(prefix)]
    if any(".." in Path(m).parts for m in members):
        raise SystemExit(f"{archive.filename}: a path of {name} leaves its directory")
    if not members:
        raise SystemExit(f"{archive.filename} has no collection {name}")
    manifest = json.loads(archive.read(prefix + "MANIFEST.json"))["collection_info"]
    version = manifest["version"]
    target = dest / prefix
    if installed_version(target) == version:
        return version
    scratch = target.with_name(target.name + ".new")
    shutil.rmtree(scratch, ignore_errors=True)
    for member in members:
        path = scratch / member[len(prefix) :]
        if member.endswith("/"):
            path.mkdir(parents=True, exist_ok=True)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(archive.read(member))
    shutil.rmtree(target, ignore_errors=True)
    scratch.rename(target)
    return version


def main(argv: list[str]) -> int:
    listing = Path(argv[0]) if argv else ROOT / "collections.txt"
    pin, names = read_list(listing)
    dest = Path(sysconfig.get_paths()["purelib"])
    with zipfile.ZipFile(wheel(pin)) as archive:
        done = [f"{name} {extract(archive, name, dest)}" for name in names]
    print(f"collections from {pin} in {dest / 'ansible_collections'}: {', '.join(done)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
