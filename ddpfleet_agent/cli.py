"""The agent's command line: one dataclass, one parser, one-line errors. The train_* options'
flags, defaults and ranges come from trainer/options.py, through the generated options.py."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re

from ddpfleet_agent.files import STORAGE_READ_TIMEOUT
from ddpfleet_agent.options import FLAGS

RUN_ID_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}\Z")
# {dest: declared default} of the flags that are train_* options (--peer-timeout: peer_timeout)
DECLARED = {flag[2:].replace("-", "_"): default for flag, _, default, *_ in FLAGS}


class BadAgentInput(ValueError):
    """Bad command line: reported in one line, exit code 2."""


@dataclasses.dataclass
class AgentConfig:
    run_dir: str
    run_id: str
    host: str
    node_rank: int
    hosts: list[str]
    store_host: str
    store_port: int
    command: list[str]
    key_file: str = ""  # the run's secret: every store value is signed with it (wire.seal)
    peer_timeout: float = DECLARED["peer_timeout"]
    heartbeat_timeout: float = DECLARED["heartbeat_timeout"]
    stop_timeout: float = DECLARED["stop_timeout"]
    max_runtime: float = DECLARED["max_runtime"]
    attempt: str = ""
    log_tail_lines: int = DECLARED["log_tail_lines"]
    fallback_dir: str = ""  # host-local: this host's log and exit record, storage or not
    storage_timeout: float = STORAGE_READ_TIMEOUT  # the longest wait on one run-directory I/O
    dump_timeout: float = 5.0  # forensics: seconds to dump the ranks before a kill (0: none)
    program: str = DECLARED["program"]  # a user's program: node rank 0 writes its summary.json
    world_size: int = 0
    straggler_ratio: float = DECLARED["straggler_ratio"]
    metrics_host: str = ""  # the Prometheus endpoint's address and port ('': none)
    metrics_port: int = 0
    restarts: int = DECLARED["restarts"]
    min_hosts: int = DECLARED["min_hosts"]
    rebalance: str = DECLARED["rebalance"]  # auto: new shares for a straggler (stragglers.py)
    tick: float = 0.5  # seconds between supervision rounds
    settle: float = 2.0  # seconds to watch the peers before naming the cause of an exit
    # the hosts' cluster addresses in node-rank order ([]: not given, as by an older train.yml)
    addresses: list[str] = dataclasses.field(default_factory=list)

    @property
    def takes_hosts_back(self) -> bool:
        """A host left out may come back (regrow.py): the run may shrink and restart."""
        return bool(self.min_hosts and self.restarts)

    @property
    def can_fail_over(self) -> bool:
        """Another host may take over the run's store when its host is lost (failover.py)."""
        return bool(self.addresses) and self.takes_hosts_back

    @property
    def nproc(self) -> int:
        """Processes per host (global rank // nproc is the node rank); 1 when unknown."""
        return max(self.world_size // len(self.hosts), 1)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise BadAgentInput(message)


def _declared_type(kind: str, low: float | None, high: float | None):
    """argparse's type for a declared flag: the number in its declared range, or the string."""

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        whole = kind == "float" or value.is_integer()
        if not (math.isfinite(value) and whole and low <= value <= high):  # type: ignore[operator]
            what = "a whole number" if kind == "int" else "a number"
            raise argparse.ArgumentTypeError(f"must be {what} from {low} to {high}, not {text!r}")
        return int(value) if kind == "int" else value

    return str if kind == "str" else number


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m ddpfleet_agent")
    for flag in ("--run-dir", "--run-id", "--host"):
        p.add_argument(flag, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--hosts", required=True, help="inventory names, comma-separated, by node rank")
    p.add_argument(
        "--addresses",
        default="",
        help="the hosts' cluster addresses, comma-separated, one per host of --hosts in its order",
    )
    p.add_argument("--store", required=True, help="ADDR:PORT of the run's TCPStore (node rank 0)")
    p.add_argument(
        "--key-file", required=True, help="the run's secret (from launch): signs the store"
    )
    p.add_argument(
        "--storage-timeout",
        type=float,
        default=STORAGE_READ_TIMEOUT,
        help="seconds one read or write of the run directory may take before the agent counts "
        "the shared storage as gone",
    )
    p.add_argument(
        "--dump-timeout",
        type=_declared_type("float", 0, 60),
        default=5.0,
        help="seconds to dump the ranks' stacks into forensics/<attempt>/ before a failed "
        "run's ranks are killed (0: no dump)",
    )
    p.add_argument("--attempt", default="")
    p.add_argument(
        "--fallback-dir",
        default="",
        help="a host-local directory for this host's log and exit record, which status.yml "
        "reads when the shared storage does not answer",
    )
    p.add_argument("--world-size", type=int, default=0, help="ranks in all: maps ranks to hosts")
    p.add_argument("--metrics", default="", help="ADDR:PORT of its Prometheus endpoint ('': none)")
    for flag, kind, default, low, high, option, text in FLAGS:
        takes = "" if low is None else f" The agent takes {low} to {high}."
        what = f"{option}: {text}{takes}".replace("%", "%%") + " Default: %(default)r."
        p.add_argument(flag, type=_declared_type(kind, low, high), default=default, help=what)
    return p


def _address(flag: str, value: str) -> tuple[str, int]:
    addr, _, port = value.rpartition(":")
    if not addr or not port.isdigit() or not 0 < int(port) < 65536:
        raise BadAgentInput(f"{flag} must be ADDR:PORT, not {value!r}")
    return addr.strip("[]"), int(port)


def parse_args(argv: list[str]) -> AgentConfig:
    """Options, then ``--``, then the command to supervise."""
    if "--" not in argv:
        if {"-h", "--help"} & set(argv):
            _parser().parse_args(["--help"])  # prints every flag, the declared ones' help too
        raise BadAgentInput("give the command to supervise after --")
    cut = argv.index("--")
    ns = _parser().parse_args(argv[:cut])
    command = argv[cut + 1 :]
    if not command:
        raise BadAgentInput("give the command to supervise after --")
    hosts = [h for h in ns.hosts.split(",") if h]
    if ns.host not in hosts:
        raise BadAgentInput(f"--host {ns.host} is not in --hosts {ns.hosts}")
    if not 0 <= ns.node_rank < len(hosts) or hosts[ns.node_rank] != ns.host:
        raise BadAgentInput(f"--node-rank {ns.node_rank} does not name {ns.host} in --hosts")
    if not RUN_ID_RE.match(ns.run_id) or ns.run_id in (".", ".."):
        raise BadAgentInput(f"invalid --run-id {ns.run_id!r}")
    ns.store_host, ns.store_port = _address("--store", ns.store)
    ns.metrics_host, ns.metrics_port = _address("--metrics", ns.metrics) if ns.metrics else ("", 0)
    if not 0 <= ns.min_hosts <= len(hosts):
        raise BadAgentInput(f"--min-hosts must be from 0 to the {len(hosts)} hosts of --hosts")
    if ns.rebalance not in ("auto", "off"):
        raise BadAgentInput(f"--rebalance must be auto or off, not {ns.rebalance!r}")
    if not (math.isfinite(ns.storage_timeout) and ns.storage_timeout > 0):
        raise BadAgentInput("--storage-timeout must be a finite number > 0")
    addresses = [a.strip("[]") for a in ns.addresses.split(",")] if ns.addresses else []
    if addresses and (len(addresses) != len(hosts) or not all(addresses)):
        raise BadAgentInput(
            f"--addresses {ns.addresses} must name one address for each of the {len(hosts)} "
            f"hosts of --hosts, in the same order"
        )
    # the flags parsed into other values, then every field from the flag of its name
    ns.hosts, ns.command, ns.addresses = hosts, command, addresses
    ns.world_size = max(ns.world_size, 0)
    names = [f.name for f in dataclasses.fields(AgentConfig)]
    return AgentConfig(**{name: getattr(ns, name) for name in names if name in ns})
