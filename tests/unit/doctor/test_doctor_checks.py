"""ddpfleet_doctor: the compute, storage and network programs on the CPU, and their pure parts
(round-robin pairing, bus bandwidth, nvidia-smi parsing, timing)."""

from __future__ import annotations

import itertools
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddpfleet_doctor import cli, compute, gpuhealth, storage
from ddpfleet_doctor.network import busbw_gbps, round_robin

ROOT = Path(__file__).resolve().parents[3]


def run_json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert cli.main(argv) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1
    return json.loads(out[0])


# --- compute --------------------------------------------------------------------------------


@pytest.mark.slow
def test_compute_on_the_cpu_gives_positive_figures(capsys):
    argv = [
        "compute",
        "--arch",
        "resnet18",
        "--image-size",
        "32",
        "--batch-size",
        "4",
        "--amp",
        "off",
        "--gpus",
        "0",
        "--warmup",
        "1",
        "--seconds",
        "0.2",
        "--max-steps",
        "3",
    ]
    got = run_json(argv, capsys)
    assert got["device"] == "cpu"
    assert got["images_per_sec"] > 0
    assert got["steps_per_sec"] > 0
    assert 2 <= got["steps"] <= 3
    assert got["images_per_sec"] == pytest.approx(got["steps_per_sec"] * 4, rel=0.01)
    assert (got["per_gpu"], got["gpu_health"], got["batch_size"], got["amp"]) == (
        None,
        None,
        4,
        "off",
    )


def test_an_unknown_arch_is_one_line_and_exit_2(capsys):
    assert cli.main(["compute", "--arch", "resnet9000", "--gpus", "0"]) == 2
    err = capsys.readouterr().err
    assert err == "doctor compute: --arch resnet9000: not a torchvision classification model\n"


@pytest.mark.parametrize(
    "argv",
    [
        ["compute", "--image-size", "0"],
        ["storage", "--data-dir", "/x", "--seconds", "-1"],
        ["network", "--names", "a", "--addresses", "b", "--iters", "0"],
    ],
)
def test_non_positive_numbers_are_refused(argv, capsys):
    assert cli.main(argv) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_time_steps_runs_at_least_two_timed_steps_and_stops_at_max_steps():
    calls = []
    timed = compute.time_steps(lambda: calls.append(1), warmup=3, seconds=0.0, max_steps=50)
    assert timed["steps"] == 2
    assert len(calls) == 1 + 2  # warm-up stops at half of 0 s after one step
    timed = compute.time_steps(lambda: None, warmup=1, seconds=60.0, max_steps=5)
    assert timed["steps"] == 5


# --- nvidia-smi health (verified on real GPUs only on GPU hosts) ----------------------------

CAPTURED = """\
0, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 41, 1980, 1980, 5, 5, 16, 16, 0, 0, 612.34, 700.00
1, NVIDIA H100 80GB HBM3, 00000000:2A:00.0, 83, 1395, 1980, 5, 5, 8, 16, 2, 17, 455.10, 700.00
2, NVIDIA L4, 00000000:3B:00.0, 60, 1800, 2040, 1, 4, 16, 16, [N/A], [N/A], [Not Supported], 72.00
"""


def test_nvidia_smi_csv_is_parsed_with_numbers_and_missing_values():
    gpus = gpuhealth.parse_query(CAPTURED)
    assert [g["index"] for g in gpus] == [0, 1, 2]
    assert gpus[0]["name"] == "NVIDIA H100 80GB HBM3"
    assert gpus[0]["bus_id"] == "00000000:18:00.0"
    assert (gpus[1]["sm_clock_mhz"], gpus[1]["pcie_width"], gpus[1]["ecc_uncorrected"]) == (
        1395,
        8,
        2,
    )
    assert gpus[0]["power_w"] == 612.34
    assert (gpus[2]["ecc_uncorrected"], gpus[2]["power_w"]) == (None, None)


def test_nvidia_smi_health_names_ecc_clocks_and_pcie_width():
    health = gpuhealth.health(CAPTURED)
    assert health[0]["problems"] == []
    assert health[1]["problems"] == [
        "2 uncorrected ECC errors",
        "SM clock 1395 of 1980 MHz (power, thermal or an application clock cap)",
        "PCIe link x8 of x16",
    ]
    assert health[2]["problems"] == [
        "SM clock 1800 of 2040 MHz (power, thermal or an application clock cap)",
        "PCIe gen 1 of 4",
    ]


def test_nvidia_smi_error_text_is_refused():
    with pytest.raises(ValueError, match="columns"):
        gpuhealth.parse_query('Field "clocks.max.sm" is not a valid field to query.\n')


# --- storage --------------------------------------------------------------------------------


def test_storage_reads_and_decodes_the_jpegs(image_folder, capsys):
    got = run_json(
        ["storage", "--data-dir", str(image_folder), "--files", "12", "--seconds", "5"], capsys
    )
    assert got["files"] == 12
    assert got["read_mb_per_sec"] > 0
    assert got["jpegs_per_sec"] > 0
    assert got["decode_errors"] == 0


def test_storage_without_jpegs_is_skipped(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("x")
    got = run_json(["storage", "--data-dir", str(tmp_path)], capsys)
    assert got == {"skipped": f"no JPEGs under {tmp_path}"}


def test_each_host_starts_at_its_own_offset():
    files = list(range(12))
    shares = [storage.share(files, i, 3, 4) for i in range(3)]
    assert shares == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert storage.share(files, 2, 3, 6) == [8, 9, 10, 11, 0, 1]


# --- network --------------------------------------------------------------------------------


@pytest.mark.parametrize("n", range(1, 10))
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(n):
    rounds = round_robin(n)
    flat = [p for r in rounds for p in r]
    assert sorted(flat) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        hosts = [h for p in r for h in p]
        assert len(hosts) == len(set(hosts))
    assert len(rounds) == (0 if n < 2 else n - 1 if n % 2 == 0 else n)


@pytest.mark.parametrize(("ranks", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_busbw_is_algbw_times_2_n_minus_1_over_n(ranks, factor):
    assert busbw_gbps(2_000_000_000, 2.0, ranks) == pytest.approx(factor)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_network_with_two_local_ranks_gives_busbw_and_one_pair():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nnodes=1",
        "--nproc-per-node=2",
        "--node-rank=0",
        "--rdzv-backend=static",
        "--master-addr=127.0.0.1",
        f"--master-port={_free_port()}",
        "-m",
        "ddpfleet_doctor",
        "network",
        "--names=a,b",
        "--addresses=127.0.0.1,127.0.0.1",
        "--allreduce-mb=1",
        "--iters=2",
        "--pair-seconds=0.2",
        "--timeout=60",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=120, cwd=ROOT, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert len(lines) == 1  # rank 0 only
    got = json.loads(lines[0])
    assert got["allreduce"]["backend"] == "gloo"
    assert got["allreduce"]["ranks"] == 2
    assert got["allreduce"]["busbw_gbps"] > 0
    assert [(p["a"], p["b"]) for p in got["pairs"]] == [("a", "b")]
    assert got["pairs"][0]["gbits_per_sec"] > 0
