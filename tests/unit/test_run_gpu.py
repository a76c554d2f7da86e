"""GPU hosts in train.yml's preflight: gpus defaults to what nvidia-smi finds, no more ranks
than GPUs, a compute-capability floor, RDMA needs unlimited memlock; and the fabric options
(InfiniBand devices, NCCL_IB_* from inventory, NUMA binding) the run containers get."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin
from test_run_modules import ansible_cfg, module  # noqa: F401 (ansible_cfg: autouse fixture)

from ddpfleet_doctor import hostcheck

ROOT = Path(__file__).resolve().parents[2]
pre = load_plugin("ddpfleet_run_preflight", "roles/trainer_run/library/ddpfleet_run_preflight.py")
filters = load_plugin(
    "ddpfleet_run_filters", "roles/trainer_run/filter_plugins/ddpfleet_run_filters.py"
)
H100 = ("NVIDIA H100 80GB HBM3", "9.0")
T4 = ("Tesla T4", "7.5")
V100 = ("Tesla V100-SXM2-32GB", "7.0")


def test_nvidia_smi_rows_are_parsed() -> None:
    out = "NVIDIA H100 80GB HBM3, 9.0\nTesla T4, 7.5\n\n"
    assert pre.parse_smi(out) == [H100, T4]


@pytest.mark.parametrize(
    ("found", "wanted", "nproc", "gpus"),
    [
        ([H100] * 8, -1, 0, 8),  # no gpus in the inventory: every GPU found
        ([H100] * 8, 4, 0, 4),
        ([H100] * 8, 0, 2, 0),  # gpus: 0 on a GPU host: CPU ranks, any number
        ([], -1, 0, 0),  # a host without GPUs
        ([H100] * 2, -1, 2, 2),
    ],
)
def test_gpus_default_to_the_detected_count(found, wanted, nproc, gpus) -> None:
    assert pre.plan(found, wanted, nproc, "7.5") == ([], gpus)


def test_more_ranks_than_gpus_is_refused() -> None:
    problems, _ = pre.plan([H100] * 2, -1, 4, "7.5")
    assert problems == ["train_nproc_per_node=4 is more than the 2 GPUs to use"]


def test_more_gpus_than_found_is_refused() -> None:
    problems, _ = pre.plan([H100] * 2, 4, 0, "7.5")
    assert problems == ["2 GPUs visible, inventory says gpus=4"]


def test_a_gpu_below_the_capability_floor_is_named() -> None:
    problems, _ = pre.plan([T4, V100], -1, 0, "7.5")
    assert problems == ["GPU 1 (Tesla V100-SXM2-32GB) has compute capability 7.0, below 7.5"]


def test_infiniband_devices_are_listed(tmp_path: Path) -> None:
    (tmp_path / "uverbs0").touch()
    (tmp_path / "rdma_cm").touch()
    (tmp_path / "by-path").mkdir()
    assert hostcheck.infiniband_devices(str(tmp_path)) == [
        str(tmp_path / "rdma_cm"),
        str(tmp_path / "uverbs0"),
    ]
    assert hostcheck.infiniband_devices(str(tmp_path / "absent")) == []


def test_rdma_needs_unlimited_memlock() -> None:
    assert hostcheck.check_rdma(["/dev/infiniband/uverbs0"], {"memlock": -1}) == []
    assert hostcheck.check_rdma([], {"memlock": 65536}) == []
    (problem,) = hostcheck.check_rdma(["/dev/infiniband/uverbs0"], {"memlock": 65536})
    assert problem.startswith("/dev/infiniband is present but the Docker engine caps memlock")


IB = ["/dev/infiniband/uverbs0", "/dev/infiniband/rdma_cm"]


def test_fabric_passes_infiniband_devices_and_nccl_ib_settings() -> None:
    got = filters.fabric(IB, {"nccl_ib_hca": "mlx5_0,mlx5_1", "nccl_ib_gid_index": 3}, "node", 8)
    assert got == {
        "devices": [
            "/dev/infiniband/rdma_cm:/dev/infiniband/rdma_cm:rwm",
            "/dev/infiniband/uverbs0:/dev/infiniband/uverbs0:rwm",
        ],
        "env": {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "mlx5_0,mlx5_1"},
        "torchrun_args": ["--numa-binding=node"],
        "problems": [],
    }


def test_fabric_without_infiniband_adds_nothing() -> None:
    assert filters.fabric([], {}, "", 0) == {
        "devices": [],
        "env": {},
        "torchrun_args": [],
        "problems": [],
    }


def test_fabric_can_be_switched_off_per_host() -> None:
    got = filters.fabric(IB, {"infiniband": False}, "", 8)
    assert (got["devices"], got["env"], got["problems"]) == ([], {}, [])


@pytest.mark.parametrize(
    ("devices", "settings", "numa", "gpus", "problem"),
    [
        ([], {"nccl_ib_hca": "mlx5_0"}, "", 8, "nccl_ib_hca set but there is no /dev/infiniband"),
        (IB, {"nccl_ib_hca": "x", "infiniband": "no"}, "", 8, "set but infiniband is false"),
        ([], {}, "socket", 0, "train_numa_binding=socket needs GPUs"),
    ],
)
def test_fabric_settings_that_would_do_nothing_are_problems(devices, settings, numa, gpus, problem):
    (found,) = filters.fabric(devices, settings, numa, gpus)["problems"]
    assert problem in found


def test_numa_binding_choices_are_torchrun_s() -> None:
    specs = yaml.safe_load((ROOT / "roles/trainer_run/meta/argument_specs.yml").read_text())
    choices = specs["argument_specs"]["main"]["options"]["train_numa_binding"]["choices"]
    assert choices == ["", "node", "socket", "exclusive", "core-complex"]


@pytest.fixture
def fake_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvidia-smi on PATH that reports two H100s (the module runs it through Ansible)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\nprintf 'NVIDIA H100 80GB HBM3, 9.0\\nNVIDIA H100 80GB HBM3, 9.0\\n'\n"
    )
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


PEER = {"name": "lh", "hostname": "localhost", "cluster_ip": "127.0.0.1"}


def test_preflight_uses_every_gpu_found_without_gpus_in_the_inventory(fake_nvidia_smi) -> None:
    result = module("ddpfleet_run_preflight", {"host": "g1", "peers": [PEER], "shm_mb": 1})
    assert result["gpus"] == 2
    assert result["gpu_capabilities"] == ["9.0", "9.0"]


def test_preflight_refuses_more_ranks_than_gpus_in_one_line(fake_nvidia_smi) -> None:
    args = {"host": "g1", "peers": [PEER], "shm_mb": 1, "nproc": 3}
    msg = module("ddpfleet_run_preflight", args, expect_ok=False)["msg"]
    assert msg == "preflight failed on g1: train_nproc_per_node=3 is more than the 2 GPUs to use"
