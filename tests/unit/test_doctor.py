"""Unit tests of roles/doctor: its filters (a container's JSON line, the report with its flags
and causes, the table) and its option declarations."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "doctor"
PLUGINS = ROLE / "filter_plugins"
doctor = load_plugin("ddpfleet_doctor_filters", "roles/doctor/filter_plugins/ddpfleet_doctor.py")
output = load_plugin(
    "ddpfleet_doctor_output", "roles/doctor/filter_plugins/ddpfleet_doctor_output.py"
)
table = load_plugin("ddpfleet_doctor_table", "roles/doctor/filter_plugins/ddpfleet_doctor_table.py")
cpus = load_plugin("ddpfleet_doctor_cpus", "roles/doctor/filter_plugins/ddpfleet_doctor_cpus.py")
SPECS = yaml.safe_load((ROLE / "meta" / "argument_specs.yml").read_text())["argument_specs"]
DEFAULTS = yaml.safe_load((ROLE / "defaults" / "main.yml").read_text())
TIME = "2025-01-02T03:04:05Z"


def cpu(img: float, cpus_visible: int = 4) -> dict:
    return {
        "arch": "resnet50",
        "image_size": 224,
        "batch_size": 8,
        "amp": "off",
        "device": "cpu",
        "images_per_sec": img,
        "steps_per_sec": img / 8,
        "cpus_visible": cpus_visible,
        "per_gpu": None,
        "gpu_health": None,
    }


def storage(mb: float) -> dict:
    return {"read_mb_per_sec": mb, "jpegs_per_sec": 200.0, "files": 100}


def pairs(rates: dict[tuple[str, str], float]) -> dict:
    return {
        "allreduce": {
            "backend": "gloo",
            "size_mb": 16,
            "ranks": 3,
            "seconds": 0.1,
            "busbw_gbps": 0.22,
        },
        "pairs": [{"a": a, "b": b, "gbits_per_sec": r} for (a, b), r in rates.items()],
    }


EVEN = pairs({("node1", "node2"): 9.4, ("node1", "node3"): 9.3, ("node2", "node3"): 9.5})


def build(computes, storages=None, network=EVEN, **kw) -> dict:
    return doctor.report(computes, storages or {}, network, TIME, **kw)


# --- the container's JSON line --------------------------------------------------------------


def test_result_is_the_last_json_line_among_warnings():
    out = 'torchrun warning\n{"old": 1}\n****\n{"images_per_sec": 3.5}\nbye\n'
    assert output.result(out) == {"images_per_sec": 3.5}


@pytest.mark.parametrize(
    "out", ["", None, "doctor compute: --arch x: bad\n", "{not json}\n", "[1, 2]"]
)
def test_result_without_a_json_object_is_empty(out):
    assert output.result(out) == {}


# --- the failure message's cause -------------------------------------------------------------

# What torchrun prints when ddpfleet_doctor network fails on a rank (torch 2.x, trimmed): the
# rank's own one line first, then torchrun's traceback and its box of '=' lines.
TORCHRUN_FAILED = """\
[rank0]: doctor network: DistNetworkError: failed to connect to 10.0.0.2:29400
E1125 18:59:49.216000 29720 torch/distributed/elastic/multiprocessing/api.py:1002] failed \
(exitcode: 1) local_rank: 0 (pid: 29835) of binary: /usr/bin/python3
Traceback (most recent call last):
  File "torch/distributed/launcher/api.py", line 386, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
ddpfleet_doctor FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-25_18:59:49
  host      : node1
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 29835)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


@pytest.mark.parametrize(
    ("out", "cause"),
    [
        (TORCHRUN_FAILED, "doctor network: DistNetworkError: failed to connect to 10.0.0.2:29400"),
        (
            'Traceback (most recent call last):\n  File "x.py", line 1\n'
            "MemoryError: cannot allocate\n==========\n=====\n",
            "MemoryError: cannot allocate",
        ),
        (
            "\n".join(TORCHRUN_FAILED.replace("exitcode  : 1", "exitcode  : -9").splitlines()[1:]),
            "exitcode : -9 (pid: 29835)",
        ),
        ("warming up\nkilled by the timeout\n---------\n==== \n", "killed by the timeout"),
        ("doctor compute: --arch x: unknown\n", "doctor compute: --arch x: unknown"),
    ],
)
def test_the_failure_message_names_the_cause_not_a_separator(out, cause):
    assert output.error(out, 1) == cause


@pytest.mark.parametrize("out", ["", None, "\n=====\n-----\n"])
def test_a_container_without_a_cause_says_so_with_its_status(out):
    assert output.error(out, 137) == "the container printed nothing to name (status 137)"


# --- the flag rule --------------------------------------------------------------------------


def test_below_median_flags_only_what_is_under_the_ratio():
    assert doctor.below_median({"a": 10.0, "b": 10.0, "c": 7.1, "d": 7.3}) == []  # 0.82 of 8.65
    flags = doctor.below_median({"a": 10.0, "b": 10.0, "c": 7.1, "d": 8.0})
    assert flags == [{"subject": "c", "value": 7.1, "median": 9.0, "ratio": 0.79}]


@pytest.mark.parametrize("values", [{"a": 1.0}, {}, {"a": 0.0, "b": 0.0}])
def test_nothing_is_flagged_without_a_reference(values):
    assert doctor.below_median(values) == []


def test_equal_hosts_have_no_flags_and_the_schema_keys():
    doc = build(
        {h: cpu(12.0) for h in ("node1", "node2", "node3")},
        {h: storage(400.0) for h in ("node1", "node2", "node3")},
    )
    assert doc["flags"] == []
    assert doc["time"] == TIME
    assert set(doc["model"]) >= {"arch", "image_size", "batch_size", "amp", "device"}
    assert doc["model"]["device"] == "cpu"
    host = doc["hosts"]["node1"]
    assert set(host["compute"]) >= {"images_per_sec", "steps_per_sec", "per_gpu", "gpu_health"}
    assert host["storage"]["read_mb_per_sec"] == 400.0
    assert set(doc["network"]["allreduce"]) >= {"backend", "size_mb", "busbw_gbps"}
    assert set(doc["network"]["pairs"][0]) >= {"a", "b", "gbits_per_sec"}


def test_a_slow_host_with_a_cpu_quota_is_flagged_with_its_train_cpus():
    doc = build(
        {"node1": cpu(12.0), "node2": cpu(12.5), "node3": cpu(4.1)},
        cpus={"node1": 0, "node2": 0, "node3": 0.5},
    )
    (flag,) = doc["flags"]
    assert (flag["kind"], flag["subject"], flag["ratio"]) == ("compute", "node3", 0.34)
    assert flag["median"] == 12.0
    assert flag["cause"].startswith(
        "node3 computes at 0.34 of the median: the CPU quota (train_cpus: 0.5"
    )
    assert "thermal/clock limits" in flag["cause"]
    assert doc["hosts"]["node3"]["cpus"] == 0.5


def test_a_slow_host_without_quota_names_its_cores():
    doc = build({"node1": cpu(12.0), "node2": cpu(12.0), "node3": cpu(5.0, cpus_visible=2)})
    assert "a CPU quota or fewer cores (2 visible here)" in doc["flags"][0]["cause"]


def gpu_host(rates: list[float], health: list[dict]) -> dict:
    return {
        **cpu(sum(rates)),
        "device": "cuda",
        "per_gpu": [
            {"gpu": i, "images_per_sec": r, "steps_per_sec": r / 256} for i, r in enumerate(rates)
        ],
        "gpu_health": health,
    }


def test_a_slow_gpu_is_flagged_with_what_nvidia_smi_showed():
    sick = {
        "index": 1,
        "problems": ["SM clock 1100 of 1980 MHz (power, thermal or an application clock cap)"],
    }
    doc = build(
        {
            "g1": gpu_host(
                [2500.0, 2500.0], [{"index": 0, "problems": []}, {"index": 1, "problems": []}]
            ),
            "g2": gpu_host([2500.0, 1200.0], [{"index": 0, "problems": []}, sick]),
        },
        network=pairs({("g1", "g2"): 90.0}),
    )
    gpu_flags = [f for f in doc["flags"] if f["subject"] == "g2 gpu1"]
    assert len(gpu_flags) == 1
    assert "GPU 1: SM clock 1100 of 1980 MHz" in gpu_flags[0]["cause"]
    assert gpu_flags[0]["hosts"] == ["g2"]


def test_one_slow_host_shows_in_its_links_though_the_pair_median_is_slow():
    slow = pairs({("node1", "node2"): 9.4, ("node1", "node3"): 2.0, ("node2", "node3"): 2.1})
    doc = build({h: cpu(12.0) for h in ("node1", "node2", "node3")}, network=slow)
    (flag,) = doc["flags"]
    assert (flag["kind"], flag["subject"]) == ("link", "node3")
    assert "its NIC, MTU, cable or switch port" in flag["cause"]


def test_a_slow_pair_is_named_with_the_likely_causes():
    hosts = ("n1", "n2", "n3", "n4")
    rates = {(a, b): 9.4 for i, a in enumerate(hosts) for b in hosts[i + 1 :]}
    rates[("n2", "n4")] = 3.0
    doc = build({h: cpu(12.0) for h in hosts}, network=pairs(rates))
    pair_flags = [f for f in doc["flags"] if f["subject"] == "n2-n4"]
    assert len(pair_flags) == 1
    assert "an MTU mismatch, a slower NIC or a congested switch port" in pair_flags[0]["cause"]
    assert pair_flags[0]["hosts"] == ["n2", "n4"]


def test_slow_storage_is_flagged_and_a_skipped_host_is_a_note():
    doc = build(
        {h: cpu(12.0) for h in ("node1", "node2", "node3", "node4")},
        {
            "node1": storage(400.0),
            "node2": storage(410.0),
            "node3": storage(100.0),
            "node4": {"skipped": "no JPEGs"},
        },
    )
    (flag,) = doc["flags"]
    assert (flag["kind"], flag["subject"]) == ("storage", "node3")
    assert "NFS mount options" in flag["cause"]
    assert doc["hosts"]["node4"]["storage"] is None
    assert doc["notes"] == ["storage on node4: skipped, no JPEGs"]


# --- the table ------------------------------------------------------------------------------


def test_table_has_a_row_per_host_the_median_network_and_flag_lines():
    doc = build(
        {"node1": cpu(12.0), "node2": cpu(12.5), "node3": cpu(4.1)},
        {h: storage(400.0) for h in ("node1", "node2", "node3")},
        cpus={"node3": 0.5},
    )
    lines = table.table(doc, "/mnt/ddpfleet/doctor/20250102T030405Z.json")
    assert lines[0].startswith(f"ddpfleet doctor {TIME}: resnet50 at 224 px, batch 8")
    assert lines[1].split() == [
        "host",
        "cpus",
        "dev",
        "img/s",
        "steps/s",
        "read",
        "MB/s",
        "JPEG/s",
        "link",
        "Gbit/s",
        "flags",
    ]
    rows = {line.split()[0]: line.split() for line in lines[2:6]}
    assert rows["node3"][1:4] == ["0.5", "cpu", "4.1"]
    assert rows["node3"][-2:] == ["compute", "0.34"]
    assert rows["node1"][-1] == "ok"
    assert rows["median"][1] == "12.0"
    assert any(
        line.startswith("all-reduce 16 MB over 3 ranks (gloo): busbw 0.22 GB/s") for line in lines
    )
    assert any("slowest node1-node3" in line for line in lines)
    assert any(line.startswith("FLAG compute node3: node3 computes at 0.34") for line in lines)
    assert lines[-1] == "JSON: /mnt/ddpfleet/doctor/20250102T030405Z.json"


def test_table_lists_each_gpu_with_its_health():
    health = [
        {
            "index": 0,
            "sm_clock_mhz": 1980,
            "sm_clock_max_mhz": 1980,
            "pcie_gen": 5,
            "pcie_width": 8,
            "pcie_width_max": 16,
            "ecc_uncorrected": 0,
            "problems": ["PCIe link x8 of x16"],
        }
    ]
    doc = build({"g1": gpu_host([2500.0], health)}, network=None)
    lines = table.table(doc)
    assert (
        "  g1 gpu0: 2500.0 img/s, SM 1980/1980 MHz, PCIe gen5 x8/x16, ECC uncorrected 0: "
        "PCIe link x8 of x16" in lines
    )
    assert lines[-1].startswith("no flags")


def test_a_check_container_gets_the_quota_of_a_run_container_in_the_same_periods():
    assert cpus.cpu_quota(0.3) == {"period": 10_000, "quota": 3_000}
    assert cpus.cpu_quota(0.06) == {"period": 16_667, "quota": 1_000}
    assert cpus.cpu_quota(0) == {}  # no quota: docker_container's options omitted


# --- the plugin files -----------------------------------------------------------------------


def test_each_plugin_file_stands_alone_and_the_tasks_filters_are_each_defined_once():
    """Ansible loads every file in filter_plugins/ as a plugin of its own: each has its
    FilterModule, and the filters the tasks use are all there, none twice."""
    loaded = {Path(module.__file__).stem: module for module in (doctor, output, table, cpus)}
    assert {f.stem for f in PLUGINS.glob("*.py")} == set(loaded)
    names = [name for module in loaded.values() for name in module.FilterModule().filters()]
    assert len(names) == len(set(names))
    tasks = " ".join(f.read_text() for f in (ROLE / "tasks").glob("*.yml"))
    assert set(re.findall(r"\|\s*(ddpfleet_doctor_\w+)", tasks)) == set(names)


# --- declarations ---------------------------------------------------------------------------


def test_defaults_are_the_declared_defaults():
    declared = {name: spec.get("default") for name, spec in SPECS["main"]["options"].items()}
    assert declared == DEFAULTS


def test_the_compute_entry_point_declares_what_compute_yml_reads():
    compute = set(SPECS["compute"]["options"])
    assert {
        "doctor_arch",
        "doctor_image_size",
        "doctor_batch_size",
        "doctor_amp",
        "doctor_image",
    } <= compute
    assert compute <= set(SPECS["main"]["options"])
    text = (ROLE / "tasks" / "compute.yml").read_text()
    used = {word for word in DEFAULTS if word in text}
    assert used <= compute, used - compute
    assert "doctor_compute:" in text
