"""Unequal hosts on the sandbox: the same synthetic job with one host slowed, in two parts.

    make bench-balance                                 # launch time: train_balance off vs auto
    .venv/bin/python bench/balance_bench.py --mid-run  # mid-run: train_rebalance off vs auto

Both after `make sandbox` and site.yml (make demo does both).

Launch time (the default): one host gets a Docker CPU quota on its run containers
(``train_cpus``, the option users have too; ``--slow-host``, ``--cpus``), given in an extra
inventory file beside the sandbox's. Two train.yml runs follow: ``train_balance=off`` (every
rank the same batch: the step waits for the slow host) and ``train_balance=auto`` (each host's
share of the global batch proportional to its speed, measured before the launch by the doctor's
compute check, or taken from the newest doctor.yml result for this model). Prints each run's
total img/s (summary.json: the ranks' rates after the trainer's warm-up steps), the shares auto
chose, and the ratio, last.

Mid-run (``--mid-run``, then only this part): the hosts start equal (no ``train_cpus``); two
train.yml runs of ``--mid-run-steps`` steps, a checkpoint every 4, ``train_rebalance=off`` and
``auto``. Once progress.json says step ``--slow-at``, the slow host's run container gets a
CPU quota by ``docker update`` (as another job taking the host's CPUs would). Prints each run's
img/s from the slowdown to its last step, for auto the time from the slowdown to the first step with
new shares (the first attempt whose cause is ``rebalanced: ...``) and that cause, and the
ratio, last.

Nothing here is a timed test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the sandbox package, beside bench/

from ddpfleet_agent.container import cpu_limits  # noqa: E402
from sandbox.settings import make_settings  # noqa: E402

INVENTORY = ROOT / "inventory" / "sandbox" / "hosts.yml"
SHARED = "/mnt/ddpfleet"
HOSTS = 3  # the sandbox's nodes, one rank each: the global batch is HOSTS x --batch-size
POLL = 0.5  # seconds between progress.json reads (node rank 0's agent writes it every 2 s)
RUN_TIMEOUT = 1800.0  # seconds a mid-run wait (for the step, for the end) may take


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-host", default="node3", help="the host given a CPU quota")
    p.add_argument(
        "--cpus",
        type=float,
        default=0.2,
        help="its CPU quota: train_cpus, or with --mid-run docker update (in train_cpus' periods)",
    )
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help=f"per rank; global = this x {HOSTS}")
    p.add_argument("--steps", type=int, default=30, help="train_max_steps (launch-time part)")
    p.add_argument("--warmup", type=int, default=5, help="steps left out of img/s")
    p.add_argument(
        "--mid-run",
        action="store_true",
        help="run only the mid-run part: train_rebalance off vs auto",
    )
    p.add_argument("--mid-run-steps", type=int, default=120, help="train_max_steps (--mid-run)")
    p.add_argument(
        "--slow-at",
        type=int,
        default=20,
        help="--mid-run: the step from which the slow host has its quota",
    )
    p.add_argument(
        "--equal-cpus",
        type=float,
        default=0.4,
        help="--mid-run: every host's train_cpus before the slowdown",
    )
    p.add_argument(
        "--min-hosts",
        type=int,
        default=0,
        help="--mid-run: train_min_hosts (2: a host too slow for a share may be left out)",
    )
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    if args.mid_run and not 0 < args.slow_at < args.mid_run_steps:
        p.error(f"--slow-at must be between 1 and --mid-run-steps - 1 ({args.mid_run_steps - 1})")
    return args


def playbook(inventories: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook")]
    for inv in inventories:
        cmd += ["-i", str(inv)]
    return subprocess.run(
        [*cmd, *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=3600
    )


def job_args(args: argparse.Namespace, steps: int, **more: object) -> list[str]:
    """The synthetic job of both parts, with the part's own variables (``more``), as train.yml
    extra vars."""
    job = {
        "train_synthetic": "true",
        "train_arch": args.arch,
        "train_image_size": args.image_size,
        "train_batch_size": args.batch_size,
        "train_max_steps": steps,
        "train_throughput_warmup": args.warmup,
        "train_workers": 0,
        "train_omp_num_threads": 1,
        "train_synthetic_size": args.batch_size * HOSTS * (steps + 1),
        **more,
    }
    return [arg for name, value in job.items() for arg in ("-e", f"{name}={value}")]


def train(inventories: list[Path], run_id: str, *extra: str) -> None:
    """train.yml for run_id; on failure its output's tail and exit 1."""
    proc = playbook(inventories, "train.yml", "-e", f"run_id={run_id}", *extra)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
        raise SystemExit(1)


def write_json(path: Path | None, figures: dict) -> None:
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(figures, indent=2))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not INVENTORY.is_file():
        sys.stderr.write("bench-balance: no sandbox inventory: run `make sandbox` and site.yml\n")
        return 2
    stamp = time.strftime("%H%M%S")
    return mid_run(args, stamp) if args.mid_run else launch_time(args, stamp)


# --- launch time: train_cpus, train_balance off vs auto ---------------------------------------


def launch_time(args: argparse.Namespace, stamp: str) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        slow = Path(tmp) / "slow.yml"
        slow.write_text(f"all:\n  hosts:\n    {args.slow_host}:\n      train_cpus: {args.cpus}\n")
        job = job_args(args, args.steps, train_log_every=5)
        results = {}
        for mode in ("off", "auto"):
            rid = f"bench-balance-{stamp}-{mode}"
            train([INVENTORY, slow], rid, "-e", f"train_balance={mode}", *job)
            results[mode] = read_run(rid, "summary.json")
            if mode == "auto":
                balance = read_run(rid, "config.json")["balance"]
    report_launch_time(args, results, balance)
    return 0


def report_launch_time(args: argparse.Namespace, results: dict, balance: dict) -> None:
    off, auto = results["off"], results["auto"]
    print(
        f"slow host {args.slow_host} with train_cpus={args.cpus}; {args.arch} at "
        f"{args.image_size} px, global batch {off['global_batch']}, {args.steps} steps"
    )
    speeds = balance["speeds"]
    others = sorted(v for h, v in speeds.items() if h != args.slow_host)
    pace = speeds[args.slow_host] / others[len(others) // 2]
    shown = ", ".join(f"{h} {v:.1f}" for h, v in sorted(speeds.items()))
    print(f"img/s per host ({balance['source']}): {shown}; {args.slow_host} at {pace:.2f}x")
    for mode, s in results.items():
        shares = ", ".join(str(b) for b in s["per_rank_batch"])
        rates = ", ".join(f"{r:.1f}" for r in s["per_rank_images_per_sec"])
        print(
            f"train_balance={mode:<4}  {s['images_per_sec']:8.1f} img/s  "
            f"(per-rank batch {shares}; per-rank img/s {rates})"
        )
    ratio = auto["images_per_sec"] / off["images_per_sec"]
    write_json(args.json, {"off": off, "auto": auto, "speeds": speeds, "ratio": ratio})
    print(f"auto / off: {ratio:.2f}x")


# --- mid-run: docker update of the quota at --slow-at, train_rebalance off vs auto ------------


def mid_run(args: argparse.Namespace, stamp: str) -> int:
    node_container(args.slow_host)  # an unknown host fails here, before any launch
    job = job_args(args, args.mid_run_steps, train_log_every=4, train_checkpoint_every=4,
                   train_follow="false", train_min_hosts=args.min_hosts)  # fmt: skip
    # the sandbox's nodes share its cores: the same quota on every host, under half a core,
    # makes equal hosts equal wherever the scheduler puts their ranks (tests/e2e/test_46)
    with tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        equal = Path(tmp) / "equal.yml"
        hosts = "".join(f"    node{n}:\n      train_cpus: {args.equal_cpus}\n"
                        for n in range(1, HOSTS + 1))  # fmt: skip
        equal.write_text(f"all:\n  hosts:\n{hosts}")
        runs = {
            mode: slowed_run(args, f"bench-balance-{stamp}-midrun-{mode}", mode, job, equal)
            for mode in ("off", "auto")
        }
    print(
        f"slow host {args.slow_host} at a {args.cpus:g} CPU quota (docker update) from step "
        f"{args.slow_at}; {args.arch} at {args.image_size} px, global batch "
        f"{args.batch_size * HOSTS}, {args.mid_run_steps} steps"
    )
    for mode, fig in runs.items():
        print(run_line(mode, fig))
    ratio = runs["auto"]["images_per_sec"] / runs["off"]["images_per_sec"]
    write_json(args.json, {**runs, "ratio": ratio})
    print(f"rebalance auto / off after the slowdown: {ratio:.2f}x")
    return 0


def slowed_run(
    args: argparse.Namespace, run_id: str, mode: str, job: list[str], equal: Path
) -> dict:
    """Launch, slow the host at --slow-at, wait for the end: the run's figures."""
    train([INVENTORY, equal], run_id, "-e", f"train_rebalance={mode}", *job)
    record = wait_for(run_id, lambda r: ended(r) or step_of(r) >= args.slow_at)
    if ended(record):
        raise SystemExit(
            f"bench-balance: run {run_id} ended ({record.get('status')}) before "
            f"step {args.slow_at}: see its summary.json"
        )
    slow_down(run_id, args.slow_host, args.cpus)
    slowed_at, slowed_step = time.time(), step_of(record)
    last, last_at = wait_end(run_id)
    if last.get("status") != "completed":
        raise SystemExit(f"bench-balance: run {run_id} {last.get('status')}: see its summary.json")
    attempts = read_run(run_id, "summary.json").get("attempts") or []
    images = args.batch_size * HOSTS * (step_of(last) - slowed_step)
    return {
        "run_id": run_id,
        "slowed_step": slowed_step,
        "slowed_at": slowed_at,
        "last_step": step_of(last),
        "last_step_at": last_at,
        "images_per_sec": images / (last_at - slowed_at),
        **first_rebalance(attempts, slowed_at),
        "attempts": attempts,
    }


def first_rebalance(attempts: list[dict], slowed_at: float) -> dict:
    """The first start with new shares: its cause line and the seconds from the slowdown to its
    first step (failed_at: when node rank 0 claimed the decision; heal_sec: from then to the
    first step after the restart; None without one). Empty when there was none."""
    for a in attempts:
        if str(a.get("cause")).startswith("rebalanced: "):
            healed = None if a.get("heal_sec") is None else a["failed_at"] + a["heal_sec"]
            return {
                "rebalance": a["cause"],
                "rebalanced_after_sec": None if healed is None else healed - slowed_at,
            }
    return {}


def run_line(mode: str, fig: dict) -> str:
    line = (
        f"train_rebalance={mode:<4}  {fig['images_per_sec']:8.1f} img/s after the slowdown "
        f"(step {fig['slowed_step']} -> {fig['last_step']} in "
        f"{fig['last_step_at'] - fig['slowed_at']:.1f} s)"
    )
    if "rebalance" in fig:
        after = fig["rebalanced_after_sec"]
        shown = "none recorded" if after is None else f"{after:.1f} s after the slowdown"
        line += f"; first rebalanced step {shown}: {fig['rebalance']}"
    elif mode == "auto":
        line += "; no rebalance"
    return line


def step_of(record: dict) -> int:
    return int(record.get("step") or 0)


def ended(record: dict) -> bool:
    return record.get("state") == "ended"


def wait_end(run_id: str) -> tuple[dict, float]:
    """The final progress.json and the time of the run's last step.

    That time is the ``time`` of the first progress.json that showed the last step: node rank
    0's agent writes one every 2 s from its first rank's heartbeat (written every 1 s), so it
    comes at most ~3 s after the step, as the step read at the slowdown lags by as much. No
    record says when the last step ended: metrics.jsonl's rows have no time, summary.json's
    wall_time_sec (and last_start_wall_time_sec) takes in the final checkpoint, and attempts'
    ``ended`` is when node rank 0's agent recorded its exit, after the ranks exited and the
    peers' wait. Should no running record have shown the last step,
    the final record's time stands in (later: the figure is then a little low)."""
    first_seen: dict[int, float] = {}  # a step repeated after a restart keeps its first time

    def done(record: dict) -> bool:
        first_seen.setdefault(step_of(record), float(record["time"]))
        return ended(record)

    last = wait_for(run_id, done)
    return last, first_seen[step_of(last)]


def wait_for(run_id: str, done: Callable[[dict], bool]) -> dict:
    """Read the run's progress.json every POLL s until ``done`` says yes to it."""
    deadline = time.monotonic() + RUN_TIMEOUT
    while time.monotonic() < deadline:
        record = read_run_if_there(run_id, "progress.json")
        if record is not None and done(record):
            return record
        time.sleep(POLL)
    raise SystemExit(
        f"bench-balance: run {run_id} still going after {RUN_TIMEOUT:g} s; end it with "
        f"`.venv/bin/ansible-playbook -i {INVENTORY.relative_to(ROOT)} stop.yml -e run_id={run_id}`"
    )


def slow_down(run_id: str, host: str, cpus: float) -> None:
    """A CPU quota on the host's run container (roles/trainer_run's _trainer_run_container:
    ddpfleet-<run_id>-<inventory host>), through the Docker daemon of its node container, in
    the CFS periods a train_cpus quota gets (ddpfleet_agent.container.cpu_limits)."""
    period, quota = cpu_limits(cpus)
    limit = ["--cpu-period", str(period), "--cpu-quota", str(quota)]
    update = ["docker", "update", *limit, f"ddpfleet-{run_id}-{host}"]
    cmd = ["docker", "exec", node_container(host), *update]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench-balance: {' '.join(cmd)}: {proc.stderr.strip()}")


def node_container(host: str) -> str:
    """The sandbox's container of an inventory host (node1 -> ddpfleet-node1)."""
    nodes = {n.name: n.container for n in make_settings(None, None).nodes}
    if host not in nodes:
        raise SystemExit(f"bench-balance: {host} is not a sandbox node ({', '.join(nodes)})")
    return nodes[host]


def read_run(run_id: str, name: str) -> dict:
    """A JSON file of a run directory, through the sandbox's first node container."""
    found = read_run_if_there(run_id, name)
    if found is None:
        raise SystemExit(f"bench-balance: run {run_id} has no {name}")
    return found


def read_run_if_there(run_id: str, name: str) -> dict | None:
    """read_run, or None while the file is not there (yet)."""
    node = make_settings(None, None).nodes[0].container
    path = f"{SHARED}/runs/{run_id}/{name}"
    cmd = ["docker", "exec", node, "cat", path]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0 and "No such file" in proc.stderr:
        return None
    if proc.returncode != 0:
        raise SystemExit(f"bench-balance: cannot read {path} on {node}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


if __name__ == "__main__":
    sys.exit(main())
