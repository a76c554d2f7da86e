"""The wheelhouse the air-gapped trainer image is built from (torch, torchvision, pillow, py-spy,
the metrics libraries).

Downloaded on the host, where pip works, for the trainer base image's Python (3.11,
glibc 2.36), pinned by requirements.txt; reused while the pins are unchanged.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sandbox.dockercli import SandboxError, last_line

PACKAGES = (
    "torch", "torchvision", "pillow", "py-spy",
    "tensorboardx", "protobuf", "prometheus-client", "nvidia-ml-py",
)  # fmt: skip
PYTHON_VERSION = "3.11"
# glibc 2.36 runs every manylinux wheel from 2_5 up (py-spy's is manylinux1); pip wants each
# tag named.
PLATFORMS = [f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"]
STAMP = ".ddpfleet-complete"


def pins(requirements: Path) -> list[str]:
    """The requirements.txt lines that pin the wheelhouse's packages."""
    found = []
    for line in requirements.read_text().splitlines():
        name = line.split("==")[0].strip().lower()
        if name in PACKAGES:
            found.append(line.strip())
    if len(found) != len(PACKAGES):
        raise SandboxError(f"{requirements} must pin {', '.join(PACKAGES)} with '=='")
    return found


def is_complete(wheelhouse: Path, requirements: Path) -> bool:
    stamp = wheelhouse / STAMP
    return stamp.exists() and stamp.read_text().splitlines() == pins(requirements)


def ensure(wheelhouse: Path, requirements: Path) -> Path:
    """Download the wheelhouse unless a complete one for the current pins is there."""
    if is_complete(wheelhouse, requirements):
        return wheelhouse
    wanted = pins(requirements)
    print(f"sandbox: downloading the wheelhouse ({' '.join(wanted)}) to {wheelhouse}…")
    started = time.monotonic()
    wheelhouse.mkdir(parents=True, exist_ok=True)
    (wheelhouse / STAMP).unlink(missing_ok=True)
    args = [
        sys.executable, "-m", "pip", "download", "--quiet", *wanted,
        "--constraint", str(requirements),
        "--only-binary=:all:", "--python-version", PYTHON_VERSION,
        "--implementation", "cp", *(f"--platform={tag}" for tag in PLATFORMS),
        "--dest", str(wheelhouse),
    ]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SandboxError(f"pip download of the wheelhouse failed: {last_line(proc.stderr)}")
    (wheelhouse / STAMP).write_text("\n".join(wanted) + "\n")
    print(f"sandbox: wheelhouse ready in {time.monotonic() - started:.0f}s")
    return wheelhouse
