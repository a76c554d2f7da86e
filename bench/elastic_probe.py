"""What torchrun's elastic rendezvous does with a host lost and a host back (docs/design.md).

Three torchrun agents on this machine, as three hosts (``--nnodes 2:3``, the c10d backend, one
gloo worker each). The workers all-reduce once per step (0.2 s) and rank 0 "checkpoints" its
step every CHECKPOINT_EVERY steps to a file a restarted worker resumes from. The probe SIGKILLs
the third host (its agent and worker), then starts it again mid-interval, and prints:

- heal time: the kill to the first step at world size 2, and the steps trained again;
- regrow: when the survivors stop for the host back (at once, or at a checkpoint), the
  steps trained again, and the host's start to the first step at world size 3.

Run: .venv/bin/python bench/elastic_probe.py [--last-call 30]. A benchmark: it prints what it
saw and asserts nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ddpfleet_agent.ranks import descendants

CHECKPOINT_EVERY = 10
WORKER = """
import json, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
ckpt, log = os.environ["PROBE_CKPT"], os.environ["PROBE_LOG"]
step = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
resumed, t = step, torch.ones(1)
while True:
    dist.all_reduce(t)
    step += 1
    if rank == 0:
        with open(log, "a") as fh:
            fh.write(json.dumps({"t": time.time(), "step": step, "world": world,
                                 "resumed": resumed}) + "\\n")
        if step % int(os.environ["PROBE_EVERY"]) == 0:
            with open(ckpt + ".tmp", "w") as fh:
                fh.write(str(step))
            os.replace(ckpt + ".tmp", ckpt)
    time.sleep(0.2)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kill_host(proc: subprocess.Popen[bytes]) -> None:
    """SIGKILL a host's agent and its workers (torchrun starts each in a session of its own)."""
    for pid in [proc.pid, *descendants(proc.pid)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def steps(log: Path) -> list[dict]:
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def wait(log: Path, until, hosts: list, timeout: float = 180) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline and any(p.poll() is None for p in hosts):
        hit = next((s for s in reversed(steps(log)) if until(s)), None)
        if hit:
            return hit
        time.sleep(0.05)
    raise SystemExit(f"elastic probe: no such step (hosts ended, or {timeout:.0f} s): {log.parent}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--last-call", type=int, default=30, help="rendezvous last_call_timeout")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="elastic-probe-"))
    (work / "worker.py").write_text(WORKER)
    log, port = work / "steps.jsonl", free_port()
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    env = {**os.environ, "PROBE_CKPT": str(work / "ckpt"), "PROBE_LOG": str(log),
           "PROBE_EVERY": str(CHECKPOINT_EVERY), "OMP_NUM_THREADS": "1"}  # fmt: skip

    def host(n: int) -> subprocess.Popen[bytes]:
        cmd = [torchrun, "--nnodes=2:3", "--nproc-per-node=1", "--rdzv-backend=c10d",
               f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=probe", "--max-restarts=5",
               f"--rdzv-conf=last_call_timeout={args.last_call}", "--monitor-interval=0.5",
               str(work / "worker.py")]  # fmt: skip
        out = open(work / f"host{n}.log", "ab")  # noqa: SIM115 - the child's output, kept open
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=out, start_new_session=True)

    hosts = [host(0)]
    time.sleep(3)  # host 0 binds the rendezvous endpoint (the c10d store) first
    hosts += [host(1), host(2)]
    try:
        before = wait(log, lambda s: s["world"] == 3 and s["step"] >= 12, hosts)
        kill_host(hosts[2])
        killed_at, last3 = time.time(), steps(log)[-1]
        shrunk = wait(log, lambda s: s["world"] == 2 and s["t"] > killed_at, hosts)
        print(f"torchrun elastic (c10d, --nnodes 2:3, last_call_timeout {args.last_call} s):")
        print(f"  host SIGKILLed at step {last3['step']} (world 3 from step {before['step']}): "
              f"first step at world 2 after {shrunk['t'] - killed_at:.1f} s, resumed from "
              f"step {shrunk['resumed']}: {last3['step'] - shrunk['resumed']} step(s) trained "
              f"again")  # fmt: skip
        wait(log, lambda s: s["world"] == 2 and s["step"] % CHECKPOINT_EVERY == 4, hosts)
        hosts[2] = host(2)
        back_at, at_back = time.time(), steps(log)[-1]
        regrown = wait(log, lambda s: s["world"] == 3 and s["t"] > back_at, hosts)
        last2 = max((s for s in steps(log) if s["world"] == 2), key=lambda s: s["t"])
        print(f"  host started again at step {at_back['step']}: "
              f"the others stopped at step {last2['step']} (checkpoint every "
              f"{CHECKPOINT_EVERY}), first step at world 3 after {regrown['t'] - back_at:.1f} s, "
              f"resumed from step {regrown['resumed']}: {last2['step'] - regrown['resumed']} "
              f"step(s) trained again")  # fmt: skip
    finally:
        for p in hosts:
            kill_host(p)
    print(f"  logs: {work}")


if __name__ == "__main__":
    main()
