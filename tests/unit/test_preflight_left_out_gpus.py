"""GPU counts of the hosts a --limit run leaves out: preflight detects them where the fact cache
no longer holds them (slurm.conf, gres.conf and Prometheus' DCGM targets list every host's), and
leaves alone what it holds and what it cannot reach.

All hosts are this machine, connected locally, each with its own nvidia-smi path: a script that
answers as nvidia-smi does (there is no GPU here), none, or one that would fail if asked."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]
TWO_GPUS = "NVIDIA H100 80GB HBM3, 580.65.06\nNVIDIA H100 80GB HBM3, 580.65.06\n"


def _script(path: Path, body: str) -> str:
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return str(path)


def _run(tmp: Path, smi: dict[str, str], connect: dict[str, dict]) -> tuple[str, dict]:
    """Run preflight's GPU detection on `node` alone, each host with its nvidia-smi path (`smi`)
    and connected locally unless `connect` says otherwise; return the output and every host's
    count as hostvars show it after the run ('unknown' where there is none)."""
    local = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
    hosts = {name: {**local, "preflight_nvidia_smi_path": smi[name]} for name in smi}
    for name, how in connect.items():
        hosts[name] = {**hosts[name], **how}
    (tmp / "hosts.json").write_text(json.dumps({"all": {"hosts": hosts}}))
    counts = tmp / "counts.json"
    plays = [
        {"name": "A host whose count the fact cache holds", "hosts": "cached",
         "gather_facts": False,
         "tasks": [{"ansible.builtin.set_fact": {"ddpfleet_gpu_count": "4", "cacheable": True}}]},
        {"name": "Preflight's GPU detection on one host", "hosts": "node", "gather_facts": False,
         "any_errors_fatal": True,  # as site.yml's preflight play
         "vars": {"__preflight_probe": {"nvidia_smi": False}},
         "tasks": [
             {"ansible.builtin.include_role": {"name": "preflight", "tasks_from": "gpu.yml"}},
             {"ansible.builtin.copy": {
                 "dest": str(counts), "mode": "0644",
                 "content": "{{ dict(groups['all'] | zip(groups['all'] | map('extract', hostvars)"
                            " | map(attribute='ansible_facts')"
                            " | map(attribute='ddpfleet_gpu_count', default='unknown')))"
                            " | to_json }}"}},
         ]},
    ]  # fmt: skip
    (tmp / "play.yml").write_text(json.dumps(plays))
    env = {
        **os.environ,
        "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
        "ANSIBLE_ROLES_PATH": str(ROOT / "roles"),
        "ANSIBLE_CACHE_PLUGIN_CONNECTION": str(tmp / "facts"),
        "ANSIBLE_TIMEOUT": "5",
    }
    playbook = Path(sys.executable).with_name("ansible-playbook")
    proc = subprocess.run(
        [str(playbook), "-i", str(tmp / "hosts.json"), str(tmp / "play.yml")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=within(180), check=False,
    )  # fmt: skip
    out = f"rc={proc.returncode}\n{proc.stdout}{proc.stderr}"
    return out, json.loads(counts.read_text()) if counts.exists() else {}


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict]:
    tmp = tmp_path_factory.mktemp("gpus")
    never = tmp / "asked"
    smi = {
        "node": str(tmp / "absent"),
        "gpus": _script(tmp / "two", f"printf '{TWO_GPUS}'"),
        "none": str(tmp / "absent"),
        "cached": _script(tmp / "never", f"touch {never}; exit 9"),
        "gone": str(tmp / "absent"),
    }
    # a host that cannot be reached: nothing listens on port 9 here
    gone = {"gone": {"ansible_connection": "ssh", "ansible_host": "127.0.0.1", "ansible_port": 9}}
    out, counts = _run(tmp, smi, gone)
    return tmp, out, counts


def test_left_out_hosts_get_their_gpus_detected(limited: tuple[Path, str, dict]) -> None:
    _, out, counts = limited
    assert out.startswith("rc=0"), out[-4000:]
    assert int(counts["gpus"]) == 2, counts
    assert int(counts["none"]) == 0, counts
    assert int(counts["node"]) == 0, counts


def test_a_cached_count_is_kept_and_nvidia_smi_not_asked(limited: tuple[Path, str, dict]) -> None:
    tmp, out, counts = limited
    assert int(counts["cached"]) == 4, out[-4000:]
    assert not (tmp / "asked").exists()


def test_an_unreachable_host_left_out_stays_unknown_and_the_run_goes_on(
    limited: tuple[Path, str, dict],
) -> None:
    _, out, counts = limited
    assert counts["gone"] == "unknown", out[-4000:]


def test_detected_counts_are_cached_for_the_next_run(limited: tuple[Path, str, dict]) -> None:
    """The jsonfile cache (ansible.cfg's) holds the count a later --limit run reads."""
    tmp, out, _ = limited
    facts = json.loads(json.loads(next((tmp / "facts").glob("*gpus")).read_text())["__payload__"])
    count = facts["ddpfleet_gpu_count"]
    assert int(count["value"] if isinstance(count, dict) else count) == 2, out[-2000:]


def test_a_failing_nvidia_smi_on_a_left_out_host_is_named(tmp_path: Path) -> None:
    smi = {
        "node": str(tmp_path / "absent"),
        "broken": _script(tmp_path / "broken", "echo 'NVIDIA-SMI has failed' >&2; exit 9"),
    }
    out, _ = _run(tmp_path, smi, {})
    assert not out.startswith("rc=0"), out[-3000:]
    assert (
        "broken (left out of this run): nvidia-smi is installed but failed (NVIDIA-SMI has failed)"
        in out
    ), out[-3000:]
