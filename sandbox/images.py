"""Node and trainer-base images, built locally with debootstrap (nothing is pulled).

Each image is tagged with a hash of its recipe (files in ``sandbox/recipe/``, suite,
mirror), so an edited recipe rebuilds and an unchanged one is reused. The rootfs
tarball is cached under ``.cache/sandbox/`` too: a fresh engine re-imports it in
seconds instead of running debootstrap again.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from sandbox.dockercli import CACHE_LABEL, SandboxError, docker, docker_ok, run

RECIPE = Path(__file__).parent / "recipe"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
NODE_REPO = "ddpfleet/sandbox-node"
TRAINER_BASE_REPO = "ddpfleet/trainer-base"
TRAINER_BASE_ARCHIVE = "trainer-base.tar"


def _packages(name: str) -> list[str]:
    lines = (RECIPE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def recipe_hash(*files: str) -> str:
    """12 hex digits over the named recipe files, the suite and the mirror."""
    digest = hashlib.sha256(f"{SUITE} {MIRROR}\n".encode())
    for name in files:
        digest.update(name.encode() + b"\0" + (RECIPE / name).read_bytes())
    return digest.hexdigest()[:12]


def node_tag() -> str:
    return f"{NODE_REPO}:{SUITE}-{recipe_hash('node.packages', 'node-setup.sh', 'node-init.sh')}"


def trainer_base_tag() -> str:
    return f"{TRAINER_BASE_REPO}:{SUITE}-{recipe_hash('trainer-base.packages')}"


def _debootstrap(rootfs: Path, packages: list[str], debs: Path) -> None:
    debs.mkdir(parents=True, exist_ok=True)
    args = [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(packages)}",
        f"--cache-dir={debs}",
        SUITE,
        str(rootfs),
        MIRROR,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        log = rootfs / "debootstrap" / "debootstrap.log"
        detail = log.read_text().splitlines()[-1:] if log.exists() else proc.stderr.splitlines()
        raise SandboxError(f"debootstrap failed: {' '.join(detail[-1:]) or 'no output'}")


def _build_tarball(tag: str, packages_file: str, setup: str | None, cache: Path) -> Path:
    """Debootstrap a rootfs for ``tag`` and pack it as a tarball under ``cache``."""
    tarball = cache / "rootfs" / _tarball_name(tag)
    if tarball.exists():
        return tarball
    tarball.parent.mkdir(parents=True, exist_ok=True)
    print(f"sandbox: building {tag} with debootstrap (1-3 minutes)…", flush=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        _debootstrap(rootfs, _packages(packages_file), cache / "debs")
        if setup is not None:
            init = rootfs / "usr/local/sbin/ddpfleet-node-init"
            shutil.copyfile(RECIPE / "node-init.sh", init)
            init.chmod(0o755)
            shutil.copyfile(RECIPE / setup, rootfs / "tmp/setup.sh")
            run(["chroot", str(rootfs), "/bin/sh", "/tmp/setup.sh"], timeout=300)
            (rootfs / "tmp/setup.sh").unlink(missing_ok=True)  # setup empties /tmp
        partial = tarball.with_suffix(".partial")
        run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."])
        partial.rename(tarball)
    return tarball


def _tarball_name(tag: str) -> str:
    return f"{tag.replace('/', '_').replace(':', '_')}.tar"


def _import(tag: str, tarball: Path, changes: list[str]) -> None:
    args = ["docker", "import", "--change", f"LABEL {CACHE_LABEL}=1"]
    for change in changes:
        args += ["--change", change]
    run([*args, str(tarball), tag], timeout=600)
    _prune_superseded(tag, tarball.parent)


def _prune_superseded(tag: str, rootfs_cache: Path) -> None:
    """Drop older builds of the same image (an edited recipe): tags no container uses, tarballs."""
    repo = tag.split(":", maxsplit=1)[0]
    out = docker("image", "ls", repo, "--filter", f"label={CACHE_LABEL}", "--format", "{{.Tag}}")
    for old in out.split():
        if f"{repo}:{old}" != tag:
            run(["docker", "image", "rm", f"{repo}:{old}"], check=False)  # in use: kept
    prefix = _tarball_name(f"{repo}:")
    for path in rootfs_cache.glob(f"{prefix}*.tar"):
        if path.name != _tarball_name(tag):
            path.unlink()


def ensure_node_image(cache: Path) -> str:
    """The node image's tag, built or imported when missing."""
    tag = node_tag()
    if not docker_ok("image", "inspect", tag):
        started = time.monotonic()
        tarball = _build_tarball(tag, "node.packages", "node-setup.sh", cache)
        _import(
            tag,
            tarball,
            [
                'ENTRYPOINT ["/usr/local/sbin/ddpfleet-node-init"]',
                "ENV container=docker",
            ],
        )
        print(f"sandbox: node image {tag} ready in {time.monotonic() - started:.0f}s")
    return tag


def ensure_trainer_base(cache: Path) -> tuple[str, Path]:
    """The trainer base image's tag and its ``docker save`` archive (made when missing)."""
    tag = trainer_base_tag()
    archive = cache / "images" / TRAINER_BASE_ARCHIVE
    stamp = archive.with_suffix(".tag")
    if archive.exists() and stamp.exists() and stamp.read_text().strip() == tag:
        return tag, archive
    if not docker_ok("image", "inspect", tag):
        tarball = _build_tarball(tag, "trainer-base.packages", None, cache)
        _import(tag, tarball, ['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"])
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_suffix(".partial")
    run(["docker", "save", "-o", str(partial), tag], timeout=600)
    partial.rename(archive)
    stamp.write_text(tag + "\n")
    return tag, archive


def cached(cache: Path) -> bool:
    """True when both images are built (the host caches need no more disk)."""
    stamp = cache / "images" / f"{Path(TRAINER_BASE_ARCHIVE).stem}.tag"
    return (
        docker_ok("image", "inspect", node_tag())
        and stamp.exists()
        and stamp.read_text().strip() == trainer_base_tag()
    )


def purge(cache: Path) -> list[str]:
    """Remove the cached images and rootfs tarballs; return what was removed."""
    removed = []
    out = docker(
        "image", "ls", "--filter", f"label={CACHE_LABEL}", "--format", "{{.Repository}}:{{.Tag}}"
    )
    for tag in out.split():
        if docker_ok("image", "rm", tag):
            removed.append(tag)
    for sub in ("rootfs", "images", "debs"):
        if (cache / sub).exists():
            shutil.rmtree(cache / sub)
            removed.append(str(cache / sub))
    return removed
