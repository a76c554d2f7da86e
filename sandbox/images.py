"""Node and trainer-base images, built locally.

Where a Debian base image is present or can be pulled (``SANDBOX_BASE_IMAGE``, default
``debian:bookworm``), the recipe's Dockerfiles build them; otherwise (this machine:
nothing can be pulled) debootstrap makes a root filesystem from Debian's mirror and
``docker import`` turns it into the image. ``SANDBOX_IMAGE_BUILDER=dockerfile|debootstrap``
forces one.

Each image is tagged with a hash of the recipe files its builder uses (plus the suite and
mirror, or the base image), so an edited recipe rebuilds and an unchanged one is reused.
debootstrap's rootfs tarball is cached under ``.cache/sandbox/`` too: a fresh engine
re-imports it in seconds instead of running debootstrap again.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from sandbox.dockercli import CACHE_LABEL, SandboxError, docker, docker_ok, run

RECIPE = Path(__file__).parent / "recipe"
SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
NODE_REPO = "ddpfleet/sandbox-node"
TRAINER_BASE_REPO = "ddpfleet/trainer-base"
TRAINER_BASE_ARCHIVE = "trainer-base.tar"
BUILDERS = ("auto", "dockerfile", "debootstrap")
_chosen: dict[str, str] = {}
_choosing = threading.Lock()  # the node image and the trainer base are built side by side


def _packages(name: str) -> list[str]:
    lines = (RECIPE / name).read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def base_image() -> str:
    return os.environ.get("SANDBOX_BASE_IMAGE", f"debian:{SUITE}")


def _pullable(image: str) -> bool:
    if docker_ok("image", "inspect", image):
        return True
    try:
        return docker_ok("pull", "--quiet", image, timeout=120)
    except SandboxError:  # a pull that hangs counts as "cannot pull"
        return False


def builder() -> str:
    """``dockerfile`` when the base image is here or can be pulled, else ``debootstrap``."""
    with _choosing:
        if "builder" not in _chosen:
            choice = os.environ.get("SANDBOX_IMAGE_BUILDER", "auto")
            if choice not in BUILDERS:
                raise SandboxError(f"SANDBOX_IMAGE_BUILDER must be one of {', '.join(BUILDERS)}")
            if choice == "auto":
                choice = "dockerfile" if _pullable(base_image()) else "debootstrap"
            _chosen["builder"] = choice
        return _chosen["builder"]


def recipe_hash(*files: str) -> str:
    """12 hex digits over the named recipe files and where the packages come from."""
    source = base_image() if builder() == "dockerfile" else f"{SUITE} {MIRROR}"
    digest = hashlib.sha256(f"{source}\n".encode())
    for name in files:
        digest.update(name.encode() + b"\0" + (RECIPE / name).read_bytes())
    return digest.hexdigest()[:12]


def _recipe(packages: str, *extra: str) -> list[str]:
    """The recipe files of one image under the current builder."""
    dockerfile = [packages.replace(".packages", ".Dockerfile")] if builder() == "dockerfile" else []
    return [packages, *extra, *dockerfile]


def node_tag() -> str:
    files = _recipe("node.packages", "node-setup.sh", "node-init.sh")
    return f"{NODE_REPO}:{SUITE}-{recipe_hash(*files)}"


def trainer_base_tag() -> str:
    return f"{TRAINER_BASE_REPO}:{SUITE}-{recipe_hash(*_recipe('trainer-base.packages'))}"


def _docker_build(tag: str, dockerfile: str) -> None:
    print(f"sandbox: building {tag} from {dockerfile} on {base_image()}…", flush=True)
    run(
        [
            "docker", "build", "--quiet", "--label", f"{CACHE_LABEL}=1",
            "--build-arg", f"BASE={base_image()}", "--tag", tag,
            "--file", str(RECIPE / dockerfile), str(RECIPE),
        ],
        timeout=1800,
        env={"DOCKER_BUILDKIT": "0"},  # classic builder: engines without buildx
    )  # fmt: skip
    _prune_superseded(tag, None)


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
        # a .deb cache of its own: the other image's debootstrap may run at the same time
        debs = cache / "debs" / packages_file.removesuffix(".packages")
        _debootstrap(rootfs, _packages(packages_file), debs)
        if setup is not None:
            init = rootfs / "usr/local/sbin/ddpfleet-node-init"
            shutil.copyfile(RECIPE / "node-init.sh", init)
            init.chmod(0o755)
            shutil.copyfile(RECIPE / setup, rootfs / "tmp/setup.sh")
            run(["chroot", str(rootfs), "/bin/sh", "/tmp/setup.sh"], timeout=300)
            (rootfs / "tmp/setup.sh").unlink(missing_ok=True)  # setup empties /tmp
        _unmount_below(rootfs)
        partial = tarball.with_suffix(".partial")
        # --one-file-system: a mount left in the chroot (its /proc, held by a process) is
        # not packed; tar would read the host's /proc and fail.
        run(["tar", "--numeric-owner", "--one-file-system", "-C", str(rootfs), "-cf",
             str(partial), "."])  # fmt: skip
        partial.rename(tarball)
    return tarball


def _unmount_below(rootfs: Path) -> None:
    """Lazily unmount whatever debootstrap or the setup script left mounted in the chroot
    (deepest first): a busy /proc there would otherwise stay mounted below the temp dir."""
    prefix = f"{rootfs.resolve()}/"
    mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
    for point in sorted((m for m in mounts if m.startswith(prefix)), reverse=True):
        run(["umount", "--lazy", point], check=False)


def _tarball_name(tag: str) -> str:
    return f"{tag.replace('/', '_').replace(':', '_')}.tar"


def _import(tag: str, tarball: Path, changes: list[str]) -> None:
    args = ["docker", "import", "--change", f"LABEL {CACHE_LABEL}=1"]
    for change in changes:
        args += ["--change", change]
    run([*args, str(tarball), tag], timeout=600)
    _prune_superseded(tag, tarball.parent)


def _prune_superseded(tag: str, rootfs_cache: Path | None) -> None:
    """Drop older builds of the same image (an edited recipe): tags no container uses, tarballs."""
    repo = tag.split(":", maxsplit=1)[0]
    out = docker("image", "ls", repo, "--filter", f"label={CACHE_LABEL}", "--format", "{{.Tag}}")
    for old in out.split():
        if f"{repo}:{old}" != tag:
            run(["docker", "image", "rm", f"{repo}:{old}"], check=False)  # in use: kept
    if rootfs_cache is None:
        return
    prefix = _tarball_name(f"{repo}:").removesuffix(".tar")
    for path in rootfs_cache.glob(f"{prefix}*.tar"):
        if path.name != _tarball_name(tag):
            path.unlink()


def ensure_node_image(cache: Path) -> str:
    """The node image's tag, built or imported when missing."""
    tag = node_tag()
    if docker_ok("image", "inspect", tag):
        return tag
    started = time.monotonic()
    if builder() == "dockerfile":
        _docker_build(tag, "node.Dockerfile")
    else:
        tarball = _build_tarball(tag, "node.packages", "node-setup.sh", cache)
        changes = ['ENTRYPOINT ["/usr/local/sbin/ddpfleet-node-init"]', "ENV container=docker"]
        _import(tag, tarball, changes)
    print(f"sandbox: node image {tag} ready in {time.monotonic() - started:.0f}s")
    return tag


def _build_trainer_base(tag: str, cache: Path) -> None:
    if builder() == "dockerfile":
        _docker_build(tag, "trainer-base.Dockerfile")
    else:
        tarball = _build_tarball(tag, "trainer-base.packages", None, cache)
        _import(tag, tarball, ['CMD ["/bin/bash"]', "ENV LANG=C.UTF-8"])


def ensure_trainer_base(cache: Path) -> tuple[str, Path]:
    """The trainer base image's tag and its ``docker save`` archive (made when missing)."""
    tag = trainer_base_tag()
    archive = cache / "images" / TRAINER_BASE_ARCHIVE
    stamp = archive.with_suffix(".tag")
    if archive.exists() and stamp.exists() and stamp.read_text().strip() == tag:
        return tag, archive
    if not docker_ok("image", "inspect", tag):
        _build_trainer_base(tag, cache)
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
