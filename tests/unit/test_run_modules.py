"""The trainer_run modules, run for real through `ansible localhost -m` (no Docker needed): the
port probe and the host checks of preflight."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "trainer_run"
ANSIBLE = ROOT / ".venv" / "bin" / "ansible"


@pytest.fixture(scope="module", autouse=True)
def ansible_cfg(tmp_path_factory) -> None:
    """An ansible.cfg that loads the role's modules and prints results as JSON."""
    cfg = tmp_path_factory.mktemp("cfg") / "ansible.cfg"
    cfg.write_text(
        "[defaults]\n"
        f"library = {ROLE / 'library'}\n"
        f"module_utils = {ROLE / 'module_utils'}\n"
        "stdout_callback = ansible.builtin.json\n"
        "bin_ansible_callbacks = true\n"
        f"interpreter_python = {ROOT / '.venv' / 'bin' / 'python'}\n"
    )
    os.environ["DDPFLEET_TEST_ANSIBLE_CFG"] = str(cfg)


def module(name: str, args: dict, expect_ok: bool = True) -> dict:
    """Run one module on localhost; return its result."""
    env = {**os.environ, "ANSIBLE_CONFIG": os.environ["DDPFLEET_TEST_ANSIBLE_CFG"]}
    proc = subprocess.run(
        [
            str(ANSIBLE),
            "localhost",
            "-i",
            "localhost,",
            "-c",
            "local",
            "-m",
            name,
            "-a",
            json.dumps(args),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=within(120),
        check=False,
        cwd=ROOT,
    )
    assert proc.stdout.strip(), proc.stderr
    out = json.loads(proc.stdout)
    result = out["plays"][0]["tasks"][0]["hosts"]["localhost"]
    assert bool(result.get("failed")) is not expect_ok, result
    return result


@pytest.mark.parametrize("which", ["rendezvous", "agent"])
def test_port_probe_names_the_busy_port(which):
    with socket.socket() as busy, socket.socket() as free:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        free.bind(("127.0.0.1", 0))
        ports = {"rendezvous": free.getsockname()[1], "agent": free.getsockname()[1]}
        ports[which] = busy.getsockname()[1]
        free.close()
        result = module(
            "ddpfleet_run_port_probe",
            {"host": "node1", "ports": ports, "timeout": 1},
            expect_ok=False,
        )
    assert result["msg"] == f"{which} port {ports[which]} is busy on node1"


@pytest.mark.wallclock
def test_port_probe_with_a_busy_port_serves_the_free_one_and_refuses_at_once():
    """The peers' wait for the free port ends when they connect, not at the timeout, so a busy
    port's refusal comes in seconds (train.yml waits for the peers before it reads the probe)."""
    with socket.socket() as busy, socket.socket() as free:
        busy.bind(("0.0.0.0", 0))
        busy.listen(1)
        free.bind(("127.0.0.1", 0))
        ports = {"rendezvous": busy.getsockname()[1], "agent": free.getsockname()[1]}
        free.close()
        with ThreadPoolExecutor(max_workers=1) as pool:
            started = time.monotonic()
            probe = pool.submit(
                module,
                "ddpfleet_run_port_probe",
                {"host": "node1", "ports": ports, "expect": ["127.0.0.1"], "timeout": 60},
                expect_ok=False,
            )
            served = False
            while not probe.done() and not served:  # a peer, as wait_for: until it gets in
                with contextlib.suppress(OSError):
                    socket.create_connection(("127.0.0.1", ports["agent"]), timeout=1).close()
                    served = True
                time.sleep(0.1)
            result = probe.result()
    assert served, "the probe did not listen on the free port"
    assert time.monotonic() - started < within(30)  # the module's start, not its 60 s
    assert result["msg"] == f"rendezvous port {ports['rendezvous']} is busy on node1"


def test_port_probe_names_the_ports_each_peer_missed():
    ports = {}
    for name in ("rendezvous", "agent"):
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            ports[name] = free.getsockname()[1]
    result = module(
        "ddpfleet_run_port_probe",
        {"host": "node1", "ports": ports, "expect": ["127.0.0.1"], "timeout": 1},
    )
    assert result["missing"] == {
        "127.0.0.1": [f"rendezvous port {ports['rendezvous']}", f"agent port {ports['agent']}"]
    }


def test_preflight_names_every_problem_on_one_line():
    busy = socket.socket()
    busy.bind(("0.0.0.0", 0))
    busy.listen(1)
    port = busy.getsockname()[1]
    with busy:
        result = run_busy(port)
    msg = result["msg"]
    assert msg.startswith("preflight failed on node3: ")
    assert "\n" not in msg
    assert "no-such-host.invalid does not resolve" in msg
    assert "localhost resolves to 127.0.0.1, not its cluster_ip 10.9.9.9" in msg
    assert f"metrics port {port} is busy" in msg
    assert "/dev/shm is" in msg
    assert f"train_cpus is {len(os.sched_getaffinity(0)) + 0.5:g}, more than the " in msg


def run_busy(port: int) -> dict:
    return module(
        "ddpfleet_run_preflight",
        {
            "host": "node3",
            "peers": [
                {"name": "ghost", "hostname": "no-such-host.invalid", "cluster_ip": "10.9.9.9"},
                {"name": "lh", "hostname": "localhost", "cluster_ip": "10.9.9.9"},
            ],
            "shm_mb": 10**9,
            "ipc_host": True,
            "cpus": len(os.sched_getaffinity(0)) + 0.5,
            "free_ports": {"metrics": port},
        },
        expect_ok=False,
    )


def test_preflight_passes_and_reports_what_the_engine_may_grant():
    peer = {"name": "lh", "hostname": "localhost", "cluster_ip": "127.0.0.1"}
    cpus = len(os.sched_getaffinity(0))  # a quota of every CPU fits
    with socket.socket() as free:
        free.bind(("0.0.0.0", 0))
        port = free.getsockname()[1]  # bound, not listening: free once closed
    result = module(
        "ddpfleet_run_preflight",
        {"host": "node1", "peers": [peer], "shm_mb": 1, "cpus": cpus, "free_ports": {"m": port}},
    )
    assert result["gpu_models"] == []
    assert set(result["ulimits"]) == {"memlock", "stack"}


def test_preflight_reads_the_image_reference_and_the_shared_storage_token(tmp_path: Path):
    """What preflight.yml asserts on comes from the same call: the image (train_image, else
    site.yml's record), whether the engine has it, and the token as this host sees it."""
    peer = {"name": "lh", "hostname": "localhost", "cluster_ip": "127.0.0.1"}
    ref, token = tmp_path / "trainer_image", tmp_path / ".preflight-r1"
    ref.write_text("10.0.0.1:5000/ddpfleet/e2e-absent@sha256:" + "0" * 64 + "\n")
    token.write_text("r1-1764590000.5-42")
    base = {"host": "node1", "peers": [peer], "shm_mb": 1, "image_file": str(ref)}
    recorded = module("ddpfleet_run_preflight", {**base, "token_file": str(token)})
    assert recorded["image"] == ref.read_text().strip()
    assert recorded["image_present"] is False  # no engine here has that digest
    assert recorded["token"] == "r1-1764590000.5-42"
    chosen = module(
        "ddpfleet_run_preflight",
        {**base, "image": "ddpfleet/e2e-absent:0", "token_file": str(tmp_path / "gone")},
    )
    assert chosen["image"] == "ddpfleet/e2e-absent:0"  # the option wins over the record
    assert chosen["token"] is None  # not there: the storage is not shared
    ref.unlink()
    assert module("ddpfleet_run_preflight", base)["image"] == ""  # neither: preflight refuses
