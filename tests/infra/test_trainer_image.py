"""Node checks for the training image (role trainer_image), run on every host:

    pytest tests/infra --hosts=ansible://all --ansible-inventory=<inventory>

Every trainer holds the exact content-hash image named in /etc/ddpfleet/trainer_image; the
image carries that hash, runs as the shared storage's owner uid, imports the pinned torch and
runs the run agent and the diagnostics;
the registry holds the hash tag with the moving tag on the same image.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
STATE_FILE = "/etc/ddpfleet/trainer_image"
# Role defaults (roles/trainer_image, roles/nfs_server); the inventory may override each one.
DEFAULTS: dict[str, Any] = {
    "trainer_image_name": "ddpfleet/trainer",
    "trainer_image_moving_tag": "latest",
    "trainer_image_build_dir": "/var/lib/ddpfleet/build/trainer",
    "nfs_owner_uid": 2000,
    "nfs_owner_gid": 2000,
}


def pinned(package: str) -> str:
    """The version requirements.txt pins for ``package`` (the image must carry it)."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        name, _, version = line.partition("==")
        if name.strip().lower() == package.lower():
            return version.strip()
    raise AssertionError(f"requirements.txt does not pin {package}")


@pytest.fixture
def image(
    inventory_vars: dict[str, Any], registry_address: str, in_group: Callable[[str], bool]
) -> dict[str, Any]:
    """This host's image settings as the role saw them (inventory, else the role defaults)."""
    # These settings are plain values in the inventory (no templates): read them raw.
    found = {key: inventory_vars.get(key, default) for key, default in DEFAULTS.items()}
    found["repo"] = f"{registry_address}/{found['trainer_image_name']}"
    found["is_trainer"] = in_group("trainers")
    found["is_builder"] = in_group("registry")
    return found


@pytest.fixture
def ref(host: Any, image: dict[str, Any]) -> str:
    """The reference recorded on this host (trainers and the registry host only)."""
    if not (image["is_trainer"] or image["is_builder"]):
        pytest.skip("neither a trainer nor the registry host: no training image here")
    state = host.file(STATE_FILE)
    assert state.exists, f"{STATE_FILE} is missing"
    return state.content_string.strip()


def docker_run(host: Any, ref: str, command: str) -> Any:
    return host.run(f"docker run --rm --network none {shlex.quote(ref)} {command}")


def test_state_file_names_a_content_hash_tag(host: Any, image: dict[str, Any], ref: str) -> None:
    state = host.file(STATE_FILE)
    assert (state.user, state.group, state.mode) == ("root", "root", 0o644)
    assert host.file("/etc/ddpfleet").mode == 0o755
    assert re.fullmatch(re.escape(image["repo"]) + r":[0-9a-f]{12}", ref), ref


def test_every_trainer_holds_the_image(host: Any, image: dict[str, Any], ref: str) -> None:
    if not image["is_trainer"]:
        pytest.skip("not a trainer: the image is pre-pulled on trainers only")
    inspect = host.run(f"docker image inspect {shlex.quote(ref)}")
    assert inspect.rc == 0, f"{ref} is not on this trainer: {inspect.stderr}"
    config = json.loads(inspect.stdout)[0]["Config"]
    assert config["Labels"]["io.ddpfleet.content-hash"] == ref.rsplit(":", 1)[1]
    assert config["User"] == f"{image['nfs_owner_uid']}:{image['nfs_owner_gid']}"


def test_image_runs_as_the_shared_storage_owner(host: Any, image: dict[str, Any], ref: str) -> None:
    if not image["is_trainer"]:
        pytest.skip("not a trainer: the image is pre-pulled on trainers only")
    ids = docker_run(host, ref, "sh -c 'echo $(id -u):$(id -g)'")
    assert ids.rc == 0, ids.stderr
    assert ids.stdout.strip() == f"{image['nfs_owner_uid']}:{image['nfs_owner_gid']}"


def test_py_spy_alone_may_trace_the_ranks(host: Any, image: dict[str, Any], ref: str) -> None:
    """The forensics bundle's py-spy: CAP_SYS_PTRACE as its file capability (v2, permitted and
    effective = bit 19), which the run container's bounding set allows; python has none."""
    if not image["is_trainer"]:
        pytest.skip("not a trainer: the image is pre-pulled on trainers only")
    read = (
        "import os, struct; "
        "print(struct.unpack('<5I', os.getxattr('/opt/ddpfleet/venv/bin/py-spy', "
        "'security.capability'))[:2]); "
        "print(os.listxattr('/opt/ddpfleet/venv/bin/python3'))"
    )
    caps = docker_run(host, ref, f'python -c "{read}"')
    assert caps.rc == 0, caps.stderr
    assert caps.stdout.split("\n")[:2] == [f"({0x02000001}, {1 << 19})", "[]"], caps.stdout


def test_image_carries_the_pinned_stack(host: Any, image: dict[str, Any], ref: str) -> None:
    if not image["is_trainer"]:
        pytest.skip("not a trainer: the image is pre-pulled on trainers only")
    versions = docker_run(host, ref, "python /opt/ddpfleet/versions.py")
    assert versions.rc == 0, versions.stderr
    found = dict(
        (key.strip(), value.strip())
        for key, _, value in (line.partition(":") for line in versions.stdout.splitlines())
    )
    assert found["torch"].split("+")[0] == pinned("torch")
    assert found["torchvision"].split("+")[0] == pinned("torchvision")
    assert found["trainer"]
    assert {"cuda (build)", "cudnn", "nccl"} <= found.keys()
    # the Dockerfile's jpeg stage: the trainer decodes only the crop's region of each JPEG
    assert found["jpeg regions"] == "/opt/ddpfleet/venv/lib/libddpfleet_jpeg.so"


def test_image_runs_the_run_agent(host: Any, image: dict[str, Any], ref: str) -> None:
    """Every run container's PID 1 is `python -m ddpfleet_agent`: the image's wheel holds it."""
    if not image["is_trainer"]:
        pytest.skip("not a trainer: the image is pre-pulled on trainers only")
    agent = docker_run(
        host, ref, "python -c 'import ddpfleet_agent.supervise as s; print(s.Agent.__name__)'"
    )
    assert agent.rc == 0, agent.stderr
    assert agent.stdout.strip() == "Agent"


def test_image_runs_the_diagnostics(host: Any, image: dict[str, Any], ref: str) -> None:
    """doctor.yml runs `python -m ddpfleet_doctor` and train.yml's GPU preflight `python -m
    ddpfleet_doctor.gpucheck` in the image: its wheel holds both entry points."""
    if not image["is_trainer"]:
        pytest.skip("not a trainer: the image is pre-pulled on trainers only")
    helps = docker_run(
        host,
        ref,
        "sh -c 'python -m ddpfleet_doctor --help && python -m ddpfleet_doctor.gpucheck --help'",
    )
    assert helps.rc == 0, helps.stderr
    assert "usage: python -m ddpfleet_doctor " in helps.stdout
    assert "usage: ddpfleet_doctor.gpucheck " in helps.stdout


def manifest(host: Any, reference: str) -> dict[str, Any]:
    shown = host.run(f"docker manifest inspect {shlex.quote(reference)}")
    assert shown.rc == 0, f"the registry lacks {reference}: {shown.stderr}"
    return json.loads(shown.stdout)


def test_registry_holds_the_hash_and_the_moving_tag(
    host: Any, image: dict[str, Any], ref: str
) -> None:
    if not image["is_builder"]:
        pytest.skip("the registry host checks the registry")
    by_hash = manifest(host, ref)
    moving = manifest(host, f"{image['repo']}:{image['trainer_image_moving_tag']}")
    assert by_hash["config"]["digest"] == moving["config"]["digest"]


def test_registry_holds_the_layers_uncompressed(host: Any, image: dict[str, Any], ref: str) -> None:
    """Pushed as the tars Docker keeps (no gzip to make, none for each pull to undo): each
    layer's digest is its diff ID, in the image's order."""
    if not image["is_builder"]:
        pytest.skip("the registry host checks the registry")
    layers = manifest(host, ref)["layers"]
    assert {layer["mediaType"] for layer in layers} == {
        "application/vnd.docker.image.rootfs.diff.tar"
    }
    inspected = host.run(
        f"docker image inspect --format '{{{{json .RootFS.Layers}}}}' {shlex.quote(ref)}"
    )
    assert inspected.rc == 0, inspected.stderr
    assert [layer["digest"] for layer in layers] == json.loads(inspected.stdout)


def test_build_context_is_private_and_holds_no_wheelhouse(
    host: Any, image: dict[str, Any], ref: str
) -> None:
    """The wheelhouse reaches the build from a server that lives only as long as the build."""
    if not image["is_builder"]:
        pytest.skip("only the registry host builds")
    context = host.file(image["trainer_image_build_dir"])
    assert context.is_directory
    assert (context.user, context.mode) == ("root", 0o750)
    assert not host.file(f"{image['trainer_image_build_dir']}/wheelhouse").exists
    assert host.file(f"{image['trainer_image_build_dir']}/Dockerfile").exists
    assert not host.service("ddpfleet-wheelhouse").is_running


def test_build_context_pins_only_what_the_image_installs(host: Any, image: dict[str, Any]) -> None:
    """Only the image's own pin lines go in: a change to the controller's requirements (ansible,
    pytest, ...) must not invalidate the cached torch layer."""
    if not image["is_builder"]:
        pytest.skip("only the registry host builds")
    pins = host.file(f"{image['trainer_image_build_dir']}/requirements.txt").content_string
    names = ("torch", "torchvision", "pillow", "py-spy", "tensorboardX", "protobuf")
    names += ("prometheus-client", "nvidia-ml-py")
    expected = [f"{name}=={pinned(name)}" for name in names]
    assert pins.split() == expected
