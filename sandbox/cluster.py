"""``up``, ``down`` and ``status``: the sandbox's life cycle."""

from __future__ import annotations

import fcntl
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from sandbox import images, inventory, nodes, preflight, wheelhouse
from sandbox.dockercli import (
    LABEL,
    SandboxError,
    docker,
    engine_version,
    inspect,
    labelled,
    run,
)
from sandbox.settings import NETWORK, SHARED_VOLUME, Settings


@contextmanager
def _exclusive(settings: Settings) -> Iterator[None]:
    """One up/down at a time (e2e runs and users share one engine)."""
    settings.cache.mkdir(parents=True, exist_ok=True)
    with (settings.cache / "lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print("sandbox: waiting for another 'python -m sandbox' command to finish…")
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _ensure_key(settings: Settings) -> str:
    key = settings.key_path
    if not key.exists() or not key.with_suffix(".pub").exists():
        key.parent.mkdir(parents=True, exist_ok=True)
        key.unlink(missing_ok=True)
        key.with_suffix(".pub").unlink(missing_ok=True)
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                "ddpfleet-sandbox",
                "-f",
                str(key),
            ]
        )
    key.chmod(0o600)
    return key.with_suffix(".pub").read_text()


def _ensure_volume(name: str) -> None:
    if inspect("volume", name) is None:
        docker("volume", "create", "--label", f"{LABEL}=1", name)


def _forget_facts(settings: Settings, names: list[str]) -> None:
    """Drop Ansible's cached facts of hosts that are new (they describe a destroyed node)."""
    for name in names:
        (settings.root / ".cache" / "facts" / name).unlink(missing_ok=True)


def up(settings: Settings) -> None:
    with _exclusive(settings):
        _up(settings)


def build_images(settings: Settings) -> None:
    """Build (or reuse) the node and trainer-base images that ``up`` needs, starting nothing:
    a later ``up`` then only starts the nodes (CI builds them while the venv installs)."""
    with _exclusive(settings):
        started = time.monotonic()
        engine_version()
        node, (base, _) = _made_side_by_side(settings, wheelhouse_too=False)
        print(f"sandbox: images {node} and {base} ready in {time.monotonic() - started:.0f}s")


def _made_side_by_side(settings: Settings, wheelhouse_too: bool) -> tuple[str, tuple[str, Path]]:
    """The node image's tag and the trainer base's (tag, archive), and the wheelhouse if asked,
    each made when missing, all at once: the two debootstraps and pip mostly wait on mirrors
    and the disk (one after another they took 94 s, 79 s and 22 s of a cold `make demo`)."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        node = pool.submit(images.ensure_node_image, settings.cache)
        base = pool.submit(images.ensure_trainer_base, settings.cache)
        if wheelhouse_too:
            requirements = settings.root / "requirements.txt"
            pool.submit(wheelhouse.ensure, settings.wheelhouse, requirements).result()
        # a failure is raised once the others have ended too (leaving the pool waits for them)
        return node.result(), base.result()


def _up(settings: Settings) -> None:
    started = time.monotonic()
    engine_version()
    mode = nodes.storage_mode()
    timeout = nodes.boot_timeout()
    preflight.check_addresses(settings)
    have_network = preflight.existing_network(settings)
    existing = labelled("container")
    extra = sorted(set(existing) - {n.container for n in settings.nodes})
    if extra:
        raise SandboxError(
            f"the sandbox has more than {settings.node_count} nodes ({', '.join(extra)}); "
            "run 'python -m sandbox down' first"
        )
    if not existing:
        preflight.check_disk(
            settings,
            wheelhouse.is_complete(settings.wheelhouse, settings.root / "requirements.txt"),
            images.cached(settings.cache),
        )

    image, (base_tag, archive) = _made_side_by_side(settings, wheelhouse_too=True)
    public_key = _ensure_key(settings)

    if not have_network:
        docker(
            "network", "create", "--driver", "bridge", "--label", f"{LABEL}=1",
            "--subnet", str(settings.subnet), "--gateway", settings.gateway, NETWORK,
        )  # fmt: skip
    _ensure_volume(SHARED_VOLUME)
    actions = {}
    for node in settings.nodes:
        _ensure_volume(node.docker_volume)
        actions[node.name] = nodes.ensure_running(settings, node, image, mode)
    _forget_facts(settings, [name for name, done in actions.items() if done == "created"])
    boot = nodes.wait_booted(settings.nodes, timeout)
    for node in settings.nodes:
        nodes.mask_kernel_less_units(node)
        nodes.authorize_key(node, public_key, settings.login)
        nodes.wait_ssh(settings, node)
    hosts = inventory.write(settings, mode, base_tag, archive.name)

    for node in settings.nodes:
        print(
            f"sandbox: {node.name}  {node.container}  {node.ip}  {actions[node.name]}, "
            f"booted in {boot[node.name]:.1f}s"
        )
    print(f"sandbox: storage mode: {mode} ({_mode_text(mode)})")
    sudo = " (passwordless sudo)" if settings.login != "root" else ""
    print(f"sandbox: Ansible logs in as {settings.login}{sudo}")
    print(f"sandbox: inventory: {hosts.relative_to(settings.root)}")
    print(f"sandbox: up in {time.monotonic() - started:.1f}s")


def _mode_text(mode: str) -> str:
    if mode == "nfs":
        return "nodes mount node1's NFS export"
    return (
        "no NFS in this kernel: one shared volume stands in at the shared mount; "
        "node1 still serves it over NFS for userspace clients"
    )


def down(settings: Settings, purge: bool = False) -> None:
    with _exclusive(settings):
        _down(settings, purge)


def _down(settings: Settings, purge: bool) -> None:
    started = time.monotonic()
    engine_version()
    containers = labelled("container")
    if containers:
        docker("rm", "--force", "--volumes", *containers)
    networks = labelled("network")
    for network in networks:
        docker("network", "rm", network)
    volumes = labelled("volume")
    if volumes:
        docker("volume", "rm", "--force", *volumes)
    keys = [p for p in (settings.key_path, settings.key_path.with_suffix(".pub")) if p.exists()]
    for path in keys:
        path.unlink()
    files = inventory.remove(settings)
    _forget_facts(settings, [node.name for node in settings.nodes])
    print(f"sandbox: removed containers: {', '.join(containers) or 'none'}")
    print(
        f"sandbox: removed networks: {', '.join(networks) or 'none'}; "
        f"volumes: {', '.join(volumes) or 'none'}"
    )
    print(
        f"sandbox: removed key pair and {len(files)} inventory files"
        if keys or files
        else "sandbox: no key pair or inventory to remove"
    )
    secrets = settings.inventory_dir / ".secrets"
    if secrets.exists():
        print(
            f"sandbox: kept {secrets.relative_to(settings.root)} "
            "(made by site.yml, not by the sandbox)"
        )
    if purge:
        removed = images.purge(settings.cache)
        print(f"sandbox: purged cached images: {', '.join(removed) or 'none'}")
    else:
        print(
            "sandbox: kept the cached node/trainer-base images and .cache/ "
            "(remove them with --purge)"
        )
    print(f"sandbox: down in {time.monotonic() - started:.1f}s")


def status(settings: Settings) -> int:
    """Print the nodes that exist (whatever --nodes says), their IPs and states, and the mode."""
    engine_version()
    containers = labelled("container")
    if not containers:
        print("sandbox: not created (run 'python -m sandbox up')")
        return 1
    healthy = True
    for name in containers:
        info = inspect("container", name) or {}
        labels = info.get("Config", {}).get("Labels") or {}
        networks = info.get("NetworkSettings", {}).get("Networks") or {}
        ip = (networks.get(NETWORK) or {}).get("IPAddress") or "-"
        state = info.get("State", {}).get("Status", "missing")
        if state == "running":
            proc = run(["docker", "exec", name, "systemctl", "is-system-running"], check=False)
            state = f"running, systemd {proc.stdout.strip() or 'unreachable'}"
        healthy = healthy and state in ("running, systemd running", "running, systemd degraded")
        print(f"{labels.get(f'{LABEL}.node', '?')}  {name}  {ip}  {state}")
    mode = nodes.storage_mode()
    print(f"storage mode: {mode} ({_mode_text(mode)})")
    hosts = settings.inventory_dir / "hosts.yml"
    print(f"inventory: {hosts.relative_to(settings.root) if hosts.exists() else 'not written'}")
    return 0 if healthy else 1
