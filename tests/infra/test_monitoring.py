"""Monitoring: the node exporter on every node and Prometheus on the registry host, from the
distribution's packages, bound to the cluster address only, every node's exporter up."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

# Prometheus' answer to a query, asked on the registry host itself.
QUERY = """python3 - <<'PY'
import json, urllib.parse, urllib.request
url = "http://%s/api/v1/query?" + urllib.parse.urlencode({"query": %r})
print(json.dumps(json.load(urllib.request.urlopen(url, timeout=10))["data"]["result"]))
PY"""


def test_node_exporter_runs_on_the_cluster_address_only(
    host: Any,
    assert_service: Callable[[str], None],
    inventory_vars: dict[str, Any],
    ansible_var: Callable[[str], Any],
) -> None:
    assert_service("prometheus-node-exporter")
    port = ansible_var("monitoring_node_exporter_port")
    assert host.socket(f"tcp://{inventory_vars['cluster_ip']}:{port}").is_listening
    assert not host.socket(f"tcp://0.0.0.0:{port}").is_listening


@pytest.fixture
def prometheus(host: Any, in_group: Callable[[str], bool]) -> Any:
    if not in_group("registry"):
        pytest.skip("Prometheus runs on the registry host")
    return host


def test_prometheus_runs_with_bounded_retention(
    prometheus: Any, assert_service: Callable[[str], None], ansible_var: Callable[[str], Any]
) -> None:
    assert_service("prometheus")
    args = prometheus.file("/etc/default/prometheus").content_string
    assert f"--storage.tsdb.retention.time={ansible_var('monitoring_retention_time')}" in args
    assert f"--storage.tsdb.retention.size={ansible_var('monitoring_retention_size')}" in args
    assert prometheus.file("/etc/prometheus/consoles/ddpfleet.html").exists
    assert prometheus.file("/etc/prometheus/ddpfleet-runs").is_directory


def test_prometheus_scrapes_every_node_s_exporter(
    prometheus: Any, inventory_vars: dict[str, Any], ansible_var: Callable[[str], Any]
) -> None:
    address = f"{inventory_vars['cluster_ip']}:{ansible_var('monitoring_prometheus_port')}"
    assert prometheus.socket(f"tcp://{address}").is_listening
    nodes = sorted(set(inventory_vars["groups"]["all"]))  # testinfra lists a host per group
    found: list[dict] = []
    for _ in range(20):  # the first scrape of each node comes within one scrape interval
        found = json.loads(prometheus.check_output(QUERY % (address, 'up{job="node"}')))
        if len(found) == len(nodes) and all(r["value"][1] == "1" for r in found):
            break
        prometheus.run("sleep 2")
    # a series without the host label is named by its instance
    scraped = [(r["metric"].get("host", r["metric"]["instance"]), r["value"][1]) for r in found]
    assert sorted(scraped) == [(h, "1") for h in nodes]


def test_prometheus_holds_no_series_of_the_package_s_default_targets(
    prometheus: Any, inventory_vars: dict[str, Any], ansible_var: Callable[[str], Any]
) -> None:
    """Debian's package starts Prometheus on install with its own configuration: every address,
    localhost targets. The role installs it stopped, so no series of those targets is stored
    (they would show as a node down, without a host label, for 5 min after provisioning). Asked
    of the last hour: the check runs after provisioning, and a cluster set up by an older
    ddpfleet keeps those series for the retention time."""
    address = f"{inventory_vars['cluster_ip']}:{ansible_var('monitoring_prometheus_port')}"
    ever = 'present_over_time(up{instance=~"localhost:.*"}[1h])'
    assert json.loads(prometheus.check_output(QUERY % (address, ever))) == []
