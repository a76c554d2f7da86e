"""Unit tests of roles/trainer_run/filter_plugins: train_* options to trainer flags, the
option checks, peers and ulimits, and the run agent's archive for a user's program."""

from __future__ import annotations

import base64
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from plugin_loader import load_plugin

filters = load_plugin(
    "ddpfleet_run_filters", "roles/trainer_run/filter_plugins/ddpfleet_run_filters.py"
)


def test_trainer_args_maps_names_to_flags():
    args = filters.command_args({"batch_size": 8, "max_steps": "30", "lr": 0.05})
    assert args == ["--batch-size", "8", "--lr", "0.05", "--max-steps", "30"]


@pytest.mark.parametrize(
    ("value", "expected"),
    [(True, ["--synthetic"]), ("true", ["--synthetic"]), (False, []), ("no", [])],
)
def test_store_true_switch(value, expected):
    assert filters.command_args({"synthetic": value}) == expected


@pytest.mark.parametrize(
    ("value", "expected"), [(True, ["--channels-last"]), ("false", ["--no-channels-last"])]
)
def test_boolean_optional_switch(value, expected):
    assert filters.command_args({"channels_last": value}) == expected


def test_empty_values_leave_the_trainer_default():
    assert filters.command_args({"data_dir": "", "arch": None}) == []


def test_non_scalar_option_is_refused():
    with pytest.raises(ValueError, match="train_batch_size must be a scalar"):
        filters.command_args({"batch_size": [1, 2]})


def test_trainer_accepts_every_flag_the_role_generates():
    """The flags the role builds from its defaults parse with the trainer's own parser."""
    from trainer.config import get_args_parser  # noqa: PLC0415 - needs the trainer package

    options = {
        "data_dir": "",
        "synthetic": True,
        "synthetic_size": 64,
        "num_classes": 10,
        "image_size": 32,
        "workers": 0,
        "arch": "resnet50",
        "batch_size": 2,
        "epochs": 1,
        "max_steps": 3,
        "lr": 0.1,
        "momentum": 0.9,
        "weight_decay": 0.0001,
        "label_smoothing": 0.1,
        "warmup_epochs": 1.0,
        "lr_decay": "cosine",
        "seed": 0,
        "amp": "auto",
        "channels_last": False,
        "compile": False,
        "throughput_warmup": 3,
        "checkpoint_every": 10,
        "keep_checkpoints": 2,
        "resume": "auto",
        "log_every": 10,
        "dist_timeout": 600,
        "output_dir": "/tmp/x",
    }
    ns = get_args_parser().parse_args(filters.command_args(options))
    assert ns.synthetic is True
    assert ns.channels_last is False
    assert ns.max_steps == 3
    assert ns.output_dir == "/tmp/x"


def test_trainer_options_are_the_declared_flags_and_what_the_role_works_out():
    """Each train_* option with a trainer flag, by the flag's name (the role's defaults here)."""
    from trainer.options import OPTIONS  # noqa: PLC0415 - the declaration

    values = {name: option.default for name, option in OPTIONS.items()}
    options = filters.command_options(values, {"data_dir": "", "output_dir": "/r/x"})
    assert options["batch_size"] == 0
    assert options["checkpoint_every"] == 500
    assert options["output_dir"] == "/r/x"
    assert "nproc_per_node" not in options  # torchrun's, not the trainer's


def test_peers_need_a_cluster_ip():
    hostvars = {"n1": {"cluster_ip": "10.0.0.1", "node_hostname": "gpu1"}, "n2": {}}
    assert filters.peers(["n1"], hostvars) == [
        {"name": "n1", "hostname": "gpu1", "cluster_ip": "10.0.0.1"}
    ]
    with pytest.raises(ValueError, match="n2 has no cluster_ip"):
        filters.peers(["n2"], hostvars)


@pytest.mark.parametrize(
    ("granted", "expected"),
    [
        ({}, ["memlock:-1:-1", "stack:67108864:67108864"]),
        ({"memlock": -1, "stack": -1}, ["memlock:-1:-1", "stack:67108864:67108864"]),
        ({"memlock": 8388608, "stack": -1}, ["memlock:8388608:8388608", "stack:67108864:67108864"]),
        ({"memlock": 65536, "stack": 8388608}, ["memlock:65536:65536", "stack:8388608:8388608"]),
    ],
)
def test_ulimits_are_capped_to_what_the_engine_grants(granted, expected):
    assert filters.ulimits({"memlock": -1, "stack": 67108864}, granted) == expected


def test_train_env_values_are_hidden_and_its_names_kept():
    assert filters.hide_values({"HF_TOKEN": "hf_secret", "NCCL_DEBUG": "INFO"}) == {
        "HF_TOKEN": "(hidden)",
        "NCCL_DEBUG": "(hidden)",
    }
    assert filters.hide_values({}) == {}


def test_fallback_report_shows_each_host_s_own_exit_record():
    """status.yml's lines when the run directory cannot be read: the slurp of each host's
    fallback exit record, one missing (the killed host's agent wrote none)."""
    cause = "the shared storage did not answer within 10 s (/mnt/r); run r failed: x"
    rec = {"outcome": "failed", "exit_code": 1, "attempt": "a1", "cause": cause}
    content = base64.b64encode(json.dumps(rec).encode()).decode()
    results = [
        {"item": "node1", "content": content},
        {"item": "node2", "failed": True, "msg": "file not found"},
        {"item": "node3", "content": base64.b64encode(b"[1]").decode()},  # not a record
    ]
    assert filters.fallback_report(results, "r", "cannot open /mnt/r: Permission denied") == [
        "run r: cannot read its run directory (cannot open /mnt/r: Permission denied); "
        "each host's own record:",
        "node1: failed (exit code 1, attempt a1): the shared storage did not answer within 10 s "
        "(/mnt/r); run r failed: x",
        "node2: no exit record (its agent did not end, or the host is gone)",
        "node3: no exit record (its agent did not end, or the host is gone)",
    ]


def test_the_agent_archive_unpacks_with_program_yml_s_command_into_a_lib_that_runs(tmp_path):
    """A user's program gets the run agent from one archive (ddpfleet_agent_lib), unpacked on
    node rank 0's host by program.yml's own command: every module byte for byte, modes 0644 /
    0755, the heartbeat helper beside, and `python -m ddpfleet_agent` runs from the copy. A
    resumed run unpacks it again over the first copy."""
    root = Path(__file__).resolve().parents[2]
    tasks = yaml.safe_load((root / "roles/trainer_run/tasks/program.yml").read_text())
    task = next(t for t in tasks if "lib/" in t["name"])
    lib = tmp_path / "run dir" / "lib"
    lib.parent.mkdir()
    cmd = task["ansible.builtin.shell"]["cmd"].replace(
        "{{ _trainer_run_lib | quote }}", shlex.quote(str(lib))
    )
    archive = filters.lib_archive(root / "ddpfleet_agent")
    for _ in range(2):
        subprocess.run(["bash", "-c", cmd], input=archive + "\n", text=True, check=True)
    shipped = lib / "agent" / "ddpfleet_agent"
    sources = sorted((root / "ddpfleet_agent").glob("*.py"))
    assert sorted(p.name for p in shipped.iterdir()) == [p.name for p in sources]
    assert all((shipped / p.name).read_bytes() == p.read_bytes() for p in sources)
    helper = lib / "ddpfleet_heartbeat.py"
    assert helper.read_bytes() == (root / "ddpfleet_agent" / "ddpfleet_heartbeat.py").read_bytes()
    assert {oct(p.stat().st_mode & 0o777) for p in [*shipped.iterdir(), helper]} == {"0o644"}
    assert {oct(d.stat().st_mode & 0o777) for d in (lib, lib / "agent", shipped)} == {"0o755"}
    ran = subprocess.run(
        [sys.executable, "-m", "ddpfleet_agent"], cwd=tmp_path, capture_output=True, text=True,
        env={"PYTHONPATH": str(lib / "agent"), "PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert (ran.returncode, ran.stderr.strip()) == (
        2, "ddpfleet_agent: error: give the command to supervise after --"
    ), ran.stderr  # fmt: skip
