"""The agents' Prometheus endpoints, scraped over HTTP from real agents around real processes,
parsed with prometheus_client's own parser."""

from __future__ import annotations

import os
import signal
import socket
import time
import types
import urllib.error
import urllib.request

import pytest
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families

from ddpfleet_agent.cli import BadAgentInput, parse_args
from ddpfleet_agent.exporter import Gpus, serve

AGENT = ["--run-dir", "r", "--run-id", "t", "--host", "a", "--node-rank", "0", "--hosts", "a"]
AGENT += ["--store", "127.0.0.1:1", "--key-file", "k"]


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value), ...]} of one scrape."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def value(found: dict, name: str, **labels: str) -> float:
    (only,) = [v for got, v in found[name] if all(got.get(k) == x for k, x in labels.items())]
    return only


def scrape_when(port: int, ready, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            found = scrape(port)
            if ready(found):
                return found
        except (OSError, KeyError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"no scrape of port {port} was ready in {timeout}s")


def assert_answers_only_its_own_run(port: int) -> None:
    """Prometheus scrapes with ?run_id= from the run's discovery file (announce.yml): a target
    an earlier run on this port left behind gets 404, not this run's metrics."""
    url = f"http://127.0.0.1:{port}/metrics?run_id="
    with urllib.request.urlopen(url + "t1", timeout=5) as reply:
        assert "ddpfleet_run_info" in reply.read().decode()
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url + "an-earlier-run", timeout=5)
    assert refused.value.code == 404
    assert refused.value.read().decode() == "this endpoint serves run t1, not an-earlier-run\n"


def test_each_agent_serves_its_own_ranks_and_a_frozen_rank_ages(cluster):
    c = cluster(2, **{"heartbeat-timeout": 8})
    c.metrics_ports = [free_port(), free_port()]
    c.start({0: "run:60", 1: "run:60"})
    for node, port in enumerate(c.metrics_ports):
        stepped = lambda f, n=node: value(f, "ddpfleet_rank_step", rank=str(n)) >= 2  # noqa: E731
        found = scrape_when(port, stepped)
        (info,) = [labels for labels, _ in found["ddpfleet_run_info"]]
        assert info == {"run_id": "t1", "host": f"h{node}", "attempt": "a1", "node_rank": str(node)}
        assert [labels["rank"] for labels, _ in found["ddpfleet_rank_step"]] == [str(node)]
        assert value(found, "ddpfleet_rank_total_steps") == 1000
        assert value(found, "ddpfleet_rank_phase", phase="train") == 1
        assert value(found, "ddpfleet_rank_phase", phase="validate") == 0
        assert value(found, "ddpfleet_rank_heartbeat_age_seconds") < 2
        assert value(found, "ddpfleet_host_images_per_second") == 4.0 + node  # its own rank's
        assert value(found, "ddpfleet_run_images_per_second") == 10.0
        assert value(found, "ddpfleet_run_loss") == 1.5
        assert time.time() - 60 < value(found, "ddpfleet_run_attempt_start_time_seconds")
        assert_answers_only_its_own_run(port)
    os.kill(c.rank_pid(1), signal.SIGSTOP)  # frozen: its heartbeat thread stops writing
    time.sleep(3)
    frozen = scrape(c.metrics_ports[1])
    assert value(frozen, "ddpfleet_rank_heartbeat_age_seconds") > 2.5
    assert value(frozen, "ddpfleet_rank_progress_age_seconds") > 2.5
    assert value(scrape(c.metrics_ports[0]), "ddpfleet_rank_heartbeat_age_seconds") < 2
    c.wait(60)  # the agents fail the run on the frozen rank and exit: the endpoints go
    for port in c.metrics_ports:
        with pytest.raises(urllib.error.URLError):
            scrape(port)


def test_the_restarts_counter_counts_the_restarts_in_place(cluster):
    c = cluster(2, restarts=1)
    c.metrics_ports = [free_port(), free_port()]
    c.start({0: "run:20", 1: "crash:4:1", "0_R1": "run:6", "1_R1": "run:6"})
    for port in c.metrics_ports:
        assert value(scrape_when(port, lambda f: True), "ddpfleet_run_restarts_total") == 0
    for port in c.metrics_ports:  # the same agents, on the same ports, after the restart
        again = scrape_when(port, lambda f: value(f, "ddpfleet_run_restarts_total") == 1)
        assert [labels["attempt"] for labels, _ in again["ddpfleet_run_info"]] == ["a1"]
    assert c.wait() == [0, 0], c.output()


def test_a_busy_metrics_port_is_said_and_the_run_goes_on(cluster):
    c = cluster(1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        c.metrics_ports = [busy.getsockname()[1]]
        c.start({0: "run:2"})
        assert c.wait(60) == [0]
    log = (c.run_dir / "nodes" / "h0.log").read_text()
    assert f"metrics endpoint 127.0.0.1:{c.metrics_ports[0]} not started" in log
    assert "completed (exit code 0)" in log


def test_metrics_address_is_checked_in_one_line():
    assert parse_args([*AGENT, "--metrics", "10.0.0.2:9100", "--", "x"]).metrics_port == 9100
    assert parse_args([*AGENT, "--", "x"]).metrics_port == 0
    with pytest.raises(BadAgentInput, match="--metrics must be ADDR:PORT"):
        parse_args([*AGENT, "--metrics", "10.0.0.2", "--", "x"])


def test_gpu_metrics_names_and_labels():
    """The NVML calls' results as exposed (NVML itself runs on GPU hosts only: a stand-in
    with NVML's call names and result fields here)."""
    memory = types.SimpleNamespace(used=2 * 2**30, total=80 * 2**30)
    nvml = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0,
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetMemoryInfo=lambda h: memory,
        nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=50 + h),
        nvmlDeviceGetTemperature=lambda h, kind: 40 + h,
    )
    gpus = Gpus()
    gpus.nvml = nvml
    found = {f.name: [(s.labels, s.value) for s in f.samples] for f in gpus.collect()}
    assert found["ddpfleet_gpu_utilization_ratio"] == [({"gpu": "0"}, 0.5), ({"gpu": "1"}, 0.51)]
    assert found["ddpfleet_gpu_memory_used_bytes"][1] == ({"gpu": "1"}, 2 * 2**30)
    assert found["ddpfleet_gpu_memory_total_bytes"][0] == ({"gpu": "0"}, 80 * 2**30)
    assert found["ddpfleet_gpu_temperature_celsius"] == [({"gpu": "0"}, 40), ({"gpu": "1"}, 41)]


def test_the_endpoint_serves_on_an_ipv6_cluster_address():
    """preflight accepts an IPv6 cluster_ip: the agent's server takes the address's family."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")
    port = free_port()
    cfg = types.SimpleNamespace(run_id="t6", host="h", attempt="a", node_rank=0,
                                metrics_host="::1", metrics_port=port)  # fmt: skip
    assert serve(cfg, lambda: (0, 0.0, {}, None)) == ""
    with urllib.request.urlopen(f"http://[::1]:{port}/metrics?run_id=t6", timeout=5) as reply:
        assert 'run_id="t6"' in reply.read().decode()
