"""The run agent's flags that are train_* options read the one declaration (trainer/options.py,
through its generated table ddpfleet_agent/options.py): the same defaults and ranges, and the
flags launch.yml gives the agent (trainer.options.agent_args) read back as the values."""

from __future__ import annotations

import subprocess
import sys

import pytest
from time_bounds import within

from ddpfleet_agent.cli import AgentConfig, BadAgentInput, parse_args
from trainer.options import OPTIONS, agent_args, agent_options

BASE = ["--run-dir", "d", "--run-id", "r", "--host", "a", "--node-rank", "0", "--hosts", "a,b",
        "--store", "x:1", "--key-file", "k"]  # fmt: skip
AGENT = [o.name for o in agent_options()]
DEFAULTS = {name: opt.default for name, opt in OPTIONS.items()}


def test_the_agent_has_a_flag_for_each_supervision_option() -> None:
    assert sorted(AGENT) == sorted(
        f"train_{n}"
        for n in ("peer_timeout", "heartbeat_timeout", "restarts", "min_hosts", "stop_timeout",
                  "max_runtime", "log_tail_lines", "straggler_ratio", "program", "rebalance")
    )  # fmt: skip


@pytest.mark.parametrize("name", AGENT)
def test_the_agent_s_default_is_the_declared_one(name: str) -> None:
    opt = OPTIONS[name]
    assert getattr(parse_args([*BASE, "--", "cmd"]), opt.agent_dest) == opt.default
    field = AgentConfig.__dataclass_fields__[opt.agent_dest]
    assert field.default == opt.default


@pytest.mark.parametrize("strings", [False, True])
def test_the_flags_launch_yml_gives_read_back_as_the_values(strings: bool) -> None:
    """As Ansible may pass them too: "60" or "60.0" for an int option."""
    values = DEFAULTS | {"train_peer_timeout": 17, "train_restarts": 3, "train_min_hosts": 1,
                         "train_straggler_ratio": 0.5, "train_program": "-pkg.train"}  # fmt: skip
    if strings:
        values = {k: f"{v}.0" if isinstance(v, int) else str(v) for k, v in values.items()}
    cfg = parse_args([*BASE, *agent_args(values), "--", "cmd"])
    for name in AGENT:
        assert getattr(cfg, OPTIONS[name].agent_dest) == type(OPTIONS[name].default)(
            float(values[name]) if OPTIONS[name].type != "str" else values[name]
        ), name


def _bad_values(name: str) -> list[str]:
    opt = OPTIONS[name]
    low = opt.min if opt.agent_min is None else opt.agent_min
    bad = [str(low - 1), str(opt.max + 1), "nan", "inf", "ten"]
    return [*bad, "1.5"] if opt.type == "int" else bad


@pytest.mark.parametrize(
    ("flag", "value"),
    [(OPTIONS[n].agent_flag, v) for n in AGENT if OPTIONS[n].type != "str" for v in _bad_values(n)],
)
def test_a_value_outside_the_declaration_is_one_line_naming_the_flag(flag: str, value: str) -> None:
    with pytest.raises(BadAgentInput, match=f"^argument {flag}: must be .* from ") as err:
        parse_args([*BASE, f"{flag}={value}", "--", "cmd"])
    assert "\n" not in str(err.value)


def test_min_hosts_is_also_bounded_by_the_hosts() -> None:
    with pytest.raises(BadAgentInput, match="--min-hosts must be from 0 to the 2 hosts"):
        parse_args([*BASE, "--min-hosts=3", "--", "cmd"])


def test_a_bad_declared_flag_exits_2_with_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ddpfleet_agent", *BASE, "--restarts=1001", "--", "true"],
        capture_output=True, text=True, timeout=within(60), check=False,
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "ddpfleet_agent: error: argument --restarts: must be a whole number from 0 to 1000, "
        "not '1001'"
    ]


def test_addresses_are_the_hosts_cluster_addresses_in_node_rank_order() -> None:
    cfg = parse_args([*BASE, "--addresses=10.0.0.11,10.0.0.12", "--", "cmd"])
    assert cfg.addresses == ["10.0.0.11", "10.0.0.12"]
    assert parse_args([*BASE, "--", "cmd"]).addresses == []  # an older train.yml's agent


@pytest.mark.parametrize("value", ["10.0.0.11", "10.0.0.11,10.0.0.12,10.0.0.13", "10.0.0.11,"])
def test_addresses_not_one_per_host_is_one_line(value: str) -> None:
    with pytest.raises(BadAgentInput, match=r"^--addresses .* one address for each of the 2 hosts"):
        parse_args([*BASE, f"--addresses={value}", "--", "cmd"])


def test_help_shows_the_declared_flags_with_their_defaults() -> None:
    proc = subprocess.run([sys.executable, "-m", "ddpfleet_agent", "--help"], capture_output=True,
                          text=True, timeout=within(60), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "--restarts RESTARTS train_restarts: Restarts" in text
    assert "The agent takes 0 to 1000. Default: 2." in text


def test_rebalance_takes_auto_or_off_and_refuses_anything_else() -> None:
    assert parse_args([*BASE, "--rebalance", "off", "--", "cmd"]).rebalance == "off"
    with pytest.raises(BadAgentInput, match="--rebalance must be auto or off, not 'sometimes'"):
        parse_args([*BASE, "--rebalance", "sometimes", "--", "cmd"])
