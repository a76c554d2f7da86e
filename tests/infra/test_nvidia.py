"""NVIDIA Container Toolkit: present and working on GPU hosts, absent elsewhere."""

from __future__ import annotations

import json
from typing import Any

CHECK_IMAGE_VAR = "nvidia_container_toolkit_validation_image"
REPO = "/etc/apt/sources.list.d/nvidia-container-toolkit.sources"


def test_nvidia_repository_only_on_gpu_hosts(host: Any, gpu_count: int) -> None:
    if gpu_count:
        assert host.file(REPO).exists
    else:
        assert not host.file(REPO).exists


def test_repository_is_signed_by_a_keyring(host: Any, requires_gpu: int) -> None:
    assert "Signed-By: /etc/apt/keyrings/nvidia-container-toolkit.asc" in (
        host.file(REPO).content_string
    )


def test_toolkit_package_installed(host: Any, requires_gpu: int) -> None:
    assert host.package("nvidia-container-toolkit").is_installed


def test_docker_knows_the_nvidia_runtime(host: Any, requires_gpu: int) -> None:
    runtimes = json.loads(host.check_output("docker info --format '{{json .Runtimes}}'"))
    assert "nvidia" in runtimes


def test_container_sees_every_gpu(host: Any, requires_gpu: int) -> None:
    images = host.check_output(
        "docker images --format '{{.Repository}}:{{.Tag}}' --filter reference='*/cuda*'"
    ).split()
    images += host.check_output(
        "docker images --format '{{.Repository}}:{{.Tag}}' --filter reference='*cuda*'"
    ).split()
    assert images, "no CUDA image on the host (the nvidia role's validation pulls one)"
    out = host.check_output("docker run --rm --gpus all %s nvidia-smi -L", images[0])
    assert len([line for line in out.splitlines() if line.startswith("GPU ")]) == requires_gpu
