"""Agents on localhost around fake launchers: real processes, their real store, real signals."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from time_bounds import within

from ddpfleet_agent.ranks import descendants
from ddpfleet_agent.summary import TRAINER_PART

ROOT = Path(__file__).resolve().parents[3]

# A stand-in for torchrun: starts one "rank" child per --rank given (its RANK set, as torchrun
# does: the forensics find ranks by it), FAKE_SPAWN_AFTER_<rank> s after its own start where set
# (torchrun's rendezvous), waits, and exits with the first non-zero code (0 when all ranks exit
# 0), like torchrun without restarts.
LAUNCHER = r"""
import os, subprocess, sys, time
ranks = [a for a in sys.argv[1:]]
time.sleep(max(float(os.environ.get(f"FAKE_SPAWN_AFTER_{r}", 0)) for r in ranks))
procs = [subprocess.Popen([sys.executable, os.environ["FAKE_RANK"], r],
                         env={**os.environ, "RANK": r}) for r in ranks]
while True:
    codes = [p.poll() for p in procs]
    bad = [c for c in codes if c not in (None, 0)]
    if bad:
        first = next(i for i, c in enumerate(codes) if c not in (None, 0))
        print("Root Cause (first observed failure):")
        print("[0]:\n  time      : now\n  host      : here")
        print(f"  rank      : {ranks[first]} (local_rank: {first})")
        print(f"  exitcode  : {codes[first]} (pid: {procs[first].pid})", flush=True)
        for p in procs:
            if p.poll() is None:
                p.kill()
        sys.exit(1)
    if all(c == 0 for c in codes):
        sys.exit(0)
    time.sleep(0.1)
"""

# A stand-in for a trainer rank: behaviour from FAKE_<rank> = "run:<s>", "exit:<code>:<s>",
# "hang" (alive, no progress after step 3), "stoppable" (SIGTERM -> exit 143),
# "deaf" (ignores SIGTERM), "done:<s>" (a last heartbeat in phase "done", then <s> seconds
# before it exits 0, as a trainer tearing down), "killed:<s>" (SIGKILLs itself after <s>),
# "crash:<step>:<code>" (exits <code> on reaching <step>). FAKE_<rank>_R<n>, where set, is the
# rank's mode in the agents' generation n (DDPFLEET_RESTART=n: the n-th start after the first).
# Times count from the rank's start, or from FAKE_T0 (an epoch time) when the test sets one.
# Writes heartbeats like the trainer (a thread), with a checkpoint every 5 steps ("saved"),
# and, as trainer rank 0 does at its end (not when killed), FAKE_PART (the trainer's part of
# summary.json) to FAKE_PART_PATH, where the test sets them (Cluster.part).
RANK = r"""
import atexit, json, os, signal, sys, threading, time
rank = int(sys.argv[1])
def hand_over(path=os.environ.get("FAKE_PART_PATH")):
    with open(path + ".tmp", "w") as fh:
        fh.write(os.environ["FAKE_PART"])
    os.replace(path + ".tmp", path)
if rank == 0 and os.environ.get("FAKE_PART"):
    atexit.register(hand_over)
restart = os.environ.get("DDPFLEET_RESTART", "0")
mode = os.environ.get(f"FAKE_{rank}_R{restart}", os.environ.get(f"FAKE_{rank}", "run:60"))
mode = mode.split(":")
hb_dir = os.environ["DDPFLEET_HEARTBEAT_DIR"]
state = {"step": 0, "progress_time": time.time(), "phase": "train"}
beating = [True]
def beat():
    while beating[0]:
        rec = {"rank": rank, "local_rank": 0, "pid": os.getpid(), "host": "h", "time": time.time(),
               "step": state["step"], "total_steps": 1000, "epoch": 0, "phase": state["phase"],
               "progress_time": state["progress_time"], "loss": 1.5, "images_per_sec": 10.0,
               "rank_images_per_sec": 4.0 + rank, "saved": state["step"] // 5 * 5}
        tmp = os.path.join(hb_dir, f".rank-{rank}.tmp")
        with open(tmp, "w") as fh:
            json.dump(rec, fh)
        os.replace(tmp, os.path.join(hb_dir, f"rank-{rank}.json"))
        time.sleep(0.3)
threading.Thread(target=beat, daemon=True).start()
stop = []
if mode[0] == "stoppable":
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
if mode[0] == "deaf":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if mode[0] == "done":
    state["step"], state["phase"] = 5, "done"
    time.sleep(0.8)  # the "done" record is written
    beating[0] = False
    time.sleep(float(mode[1]))
    sys.exit(0)
t0 = float(os.environ.get("FAKE_T0") or time.time())
deadline = t0 + (float(mode[-1]) if mode[0] in ("run", "exit", "killed") else 120)
while time.time() < deadline:
    if stop:
        time.sleep(0.5)
        sys.exit(143)
    if not (mode[0] == "hang" and state["step"] >= 3 + rank):
        state["step"] += 1
        state["progress_time"] = time.time()
    if mode[0] == "crash" and state["step"] >= int(mode[1]):
        time.sleep(0.4)  # its heartbeat says the step
        sys.exit(int(mode[2]))
    time.sleep(0.2)
if mode[0] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
sys.exit(int(mode[1]) if mode[0] == "exit" else 0)
"""


# The agent with one method replaced by one that raises: python -c DEFECT <agent args>.
DEFECT = """
import sys
from ddpfleet_agent import supervise
def defect(self, *args, **kwargs):
    raise KeyError("a defect planted by the test")
supervise.Agent.{method} = defect
from ddpfleet_agent.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """n agents on this machine, one rank each (global rank = node rank)."""

    def __init__(self, tmp: Path, hosts: int, **options: float):
        self.tmp = tmp
        self.run_dir = tmp / "run"
        self.run_dir.mkdir()
        self.hosts = [f"h{i}" for i in range(hosts)]
        self.port = free_port()
        (tmp / "launcher.py").write_text(LAUNCHER)
        (tmp / "rank.py").write_text(RANK)
        # restarts: 0 unless a test asks for them (the declared default, train_restarts', is 2)
        self.options = {"peer-timeout": 4, "heartbeat-timeout": 4, "stop-timeout": 5,
                        "restarts": 0, **options}  # fmt: skip
        self.procs: list[subprocess.Popen[str]] = []
        self.modes: dict[int | str, str] = {}
        self.t0 = 0.0
        self.metrics_ports: list[int] = []  # node n's --metrics 127.0.0.1:<port>, if given
        self.part: dict | None = None  # what rank 0 hands over at its end, as the trainer does
        self.tmpdir = tmp / "tmp"
        self.tmpdir.mkdir()
        self.key = os.urandom(32).hex().encode()  # the run's secret, as train.yml makes it
        self.key_file = tmp / "agent.key"
        self.key_file.write_bytes(self.key + b"\n")
        self.key_file.chmod(0o600)

    def start(
        self, modes: dict[int | str, str], defects: dict[int, str] | None = None, t0: float = 0.0
    ) -> None:
        """Start every host's agent; ``defects[node]``: an Agent method that raises there (a
        stand-in for a bug in the agent itself, which is what its last-resort handler is for);
        ``t0``: the epoch time the modes' times count from, on every host alike."""
        self.modes, self.t0 = modes, t0
        for node in range(len(self.hosts)):
            self.procs.append(self._agent(node, (defects or {}).get(node)))

    def start_again(self, node: int) -> None:
        """Start the agent of ``node`` again, as its container is after it was killed (a restart
        policy, a re-run of train.yml): the same command, the same ranks' modes."""
        assert self.procs[node].poll() is not None, "the host's agent still runs"
        self.procs[node] = self._agent(node, None)

    def _agent(self, node: int, defect: str | None) -> subprocess.Popen[str]:
        agent = ["-m", "ddpfleet_agent"] if defect is None else ["-c", DEFECT.format(method=defect)]
        args = [sys.executable, *agent, "--run-dir", str(self.run_dir),
                "--run-id", "t1", "--host", self.hosts[node], "--node-rank", str(node),
                "--hosts", ",".join(self.hosts), "--store", f"127.0.0.1:{self.port}",
                "--attempt", "a1", "--key-file", str(self.key_file)]  # fmt: skip
        for name, value in self.options.items():
            args += [f"--{name}", str(value)]
        if self.metrics_ports:
            args += ["--metrics", f"127.0.0.1:{self.metrics_ports[node]}"]
        args += ["--", sys.executable, str(self.tmp / "launcher.py"), str(node)]
        env = {**os.environ, "FAKE_RANK": str(self.tmp / "rank.py"), "PYTHONPATH": str(ROOT)}
        env["TMPDIR"] = str(self.tmpdir)  # where the agents keep their heartbeat files
        env.update({f"FAKE_{r}": m for r, m in self.modes.items()})
        if self.part is not None:
            env["FAKE_PART"], env["FAKE_PART_PATH"] = json.dumps(self.part), str(self.part_path)
        if self.t0:
            env["FAKE_T0"] = str(self.t0)
        return subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)  # fmt: skip

    def wait(self, timeout: float = 60) -> list[int]:
        timeout = within(timeout)
        deadline = time.monotonic() + timeout
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                p.kill()
                pytest.fail(f"agent still running after {timeout}s:\n{self.output()}")
        return codes

    def output(self) -> str:
        out = []
        for p in self.procs:
            if p.poll() is not None and p.stdout:
                out.append(p.stdout.read())
        return "\n---\n".join(out)

    @property
    def part_path(self) -> Path:
        """Where ddpfleet's trainer hands its part of summary.json over."""
        return self.run_dir / TRAINER_PART

    def json(self, name: str) -> dict:
        return json.loads((self.run_dir / name).read_text())

    def heartbeat_ready(self, node: int, step: int = 1, timeout: float = 30) -> None:
        """Wait until the agent of `node` has published a step of its rank in progress."""
        deadline = time.monotonic() + within(timeout)
        while time.monotonic() < deadline:
            log = self.run_dir / "nodes" / f"{self.hosts[node]}.log"
            if log.exists() and "node_rank" in log.read_text():
                time.sleep(step)
                return
            time.sleep(0.2)
        pytest.fail("agent never started")

    def wait_said(self, node: int, text: str, timeout: float) -> None:
        """Wait until the agent of ``node`` has said ``text`` in its log (nodes/<host>.log)."""
        log = self.run_dir / "nodes" / f"{self.hosts[node]}.log"
        deadline = time.monotonic() + timeout
        while text not in log.read_text():
            assert time.monotonic() < deadline, self.output()
            time.sleep(0.3)

    def rank_pid(self, node: int) -> int:
        """The fake rank process under node's agent (waits for it to have a heartbeat)."""
        deadline = time.monotonic() + within(20)
        while time.monotonic() < deadline:
            for pid in descendants(self.procs[node].pid):
                with contextlib.suppress(OSError):
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if any(part.endswith(b"rank.py") for part in cmdline):
                        time.sleep(1.5)  # its heartbeat thread has written by now
                        return pid
            time.sleep(0.2)
        raise AssertionError(f"no rank process under agent {node}")

    def kill_host(self, node: int) -> None:
        """SIGKILL an agent and everything below it, as when its container is killed."""
        for pid in [self.procs[node].pid, *descendants(self.procs[node].pid)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.procs[node].wait(10)

    def freeze_host(self, node: int, seconds: float) -> None:
        """SIGSTOP an agent and everything below it for ``seconds``, then SIGCONT: a paused VM
        or container; to the others, a host cut off for that long that comes back."""
        agent = self.procs[node].pid
        tree = [agent, *descendants(agent)]
        for pid in tree:
            os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        for pid in tree:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def stop_all(self) -> None:
        for node, p in enumerate(self.procs):
            if p.poll() is None:
                self.kill_host(node)


@pytest.fixture
def cluster(tmp_path: Path):
    made: list[Cluster] = []

    def make(hosts: int = 2, **options: float) -> Cluster:
        c = Cluster(tmp_path, hosts, **options)
        made.append(c)
        return c

    yield make
    for c in made:
        c.stop_all()
