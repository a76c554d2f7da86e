"""sandbox/images.py: a mount left in the debootstrap chroot does not break the node image
build (issue 27, item 10: tar read the chroot's mounted /proc when something held it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sandbox import images  # noqa: E402


def _mounted_below(path: Path) -> list[str]:
    prefix = f"{path.resolve()}/"
    lines = Path("/proc/mounts").read_text().splitlines()
    return [line.split()[1] for line in lines if line.split()[1].startswith(prefix)]


def test_a_busy_proc_in_the_chroot_is_unmounted_and_not_packed(tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    (rootfs / "proc").mkdir(parents=True)
    (rootfs / "etc").mkdir()
    (rootfs / "etc" / "hostname").write_text("node\n")
    subprocess.run(["mount", "-t", "proc", "proc", str(rootfs / "proc")], check=True)
    holder = subprocess.Popen(["sleep", "60"], cwd=rootfs / "proc")  # keeps /proc busy
    try:
        assert _mounted_below(rootfs) == [str((rootfs / "proc").resolve())]
        images._unmount_below(rootfs)
        assert _mounted_below(rootfs) == []
    finally:
        holder.kill()
        holder.wait()
        subprocess.run(["umount", "--lazy", str(rootfs / "proc")], check=False)
    listing = subprocess.run(
        ["tar", "--one-file-system", "-C", str(rootfs), "-cf", "-", "."],
        capture_output=True, check=True,
    )  # fmt: skip
    names = (
        subprocess.run(["tar", "-tf", "-"], input=listing.stdout, capture_output=True, check=True)
        .stdout.decode()
        .split()
    )
    assert "./etc/hostname" in names
    assert [n for n in names if n.startswith("./proc")] == ["./proc/"]  # the empty mount point
