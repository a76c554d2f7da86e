"""Unequal hosts on the sandbox: the same short run with one host slowed, train_balance off
against auto.

    make bench-balance          # after `make sandbox` and site.yml (make demo does both)

One host gets a Docker CPU quota on its run containers (``train_cpus``, the option users have
too; ``--slow-host``, ``--cpus``), given in an extra inventory file beside the sandbox's. Two
train.yml runs follow, the same synthetic job each: ``train_balance=off`` (every rank the same
batch: the step waits for the slow host) and ``train_balance=auto`` (each host's share of the
global batch proportional to its speed, measured before the launch by the doctor's compute
check, or taken from the newest doctor.yml result for this model). Prints each run's total
img/s (summary.json: the ranks' rates after the trainer's warm-up steps), the shares auto chose,
and the ratio, last. Nothing here is a timed test: the figures depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the sandbox package, beside bench/

from sandbox.settings import make_settings  # noqa: E402

INVENTORY = ROOT / "inventory" / "sandbox" / "hosts.yml"
SHARED = "/mnt/ddpfleet"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slow-host", default="node3", help="the host given a CPU quota")
    p.add_argument("--cpus", type=float, default=0.2, help="its train_cpus (Docker CPU quota)")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--image-size", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=16, help="per rank; global = this x 3")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of img/s")
    p.add_argument("--json", type=Path, help="also write the figures here")
    return p.parse_args(argv)


def playbook(inventories: list[Path], *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(ROOT / ".venv" / "bin" / "ansible-playbook")]
    for inv in inventories:
        cmd += ["-i", str(inv)]
    return subprocess.run(
        [*cmd, *args], cwd=ROOT, capture_output=True, text=True, check=False, timeout=3600
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not INVENTORY.is_file():
        sys.stderr.write("bench-balance: no sandbox inventory: run `make sandbox` and site.yml\n")
        return 2
    stamp = time.strftime("%H%M%S")
    with tempfile.TemporaryDirectory(prefix="bench-balance-") as tmp:
        slow = Path(tmp) / "slow.yml"
        slow.write_text(f"all:\n  hosts:\n    {args.slow_host}:\n      train_cpus: {args.cpus}\n")
        inventories = [INVENTORY, slow]
        job = [
            "-e", "train_synthetic=true", "-e", f"train_arch={args.arch}",
            "-e", f"train_image_size={args.image_size}",
            "-e", f"train_batch_size={args.batch_size}",
            "-e", f"train_max_steps={args.steps}", "-e", f"train_throughput_warmup={args.warmup}",
            "-e", "train_workers=0", "-e", "train_omp_num_threads=1", "-e", "train_log_every=5",
            "-e", f"train_synthetic_size={args.batch_size * 3 * (args.steps + 1)}",
        ]  # fmt: skip
        results = {}
        for mode in ("off", "auto"):
            rid = f"bench-balance-{stamp}-{mode}"
            proc = playbook(inventories, "train.yml", "-e", f"run_id={rid}", "-e",
                            f"train_balance={mode}", *job)  # fmt: skip
            if proc.returncode != 0:
                sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-2000:])
                return 1
            results[mode] = read_run(rid, "summary.json")
            if mode == "auto":
                balance = read_run(rid, "config.json")["balance"]
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
        print(f"train_balance={mode:<4}  {s['images_per_sec']:8.1f} img/s  "
              f"(per-rank batch {shares}; per-rank img/s {rates})")  # fmt: skip
    ratio = auto["images_per_sec"] / off["images_per_sec"]
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps({"off": off, "auto": auto, "speeds": speeds, "ratio": ratio}, indent=2)
        )
    print(f"auto / off: {ratio:.2f}x")
    return 0


def read_run(run_id: str, name: str) -> dict:
    """A JSON file of a run directory, through the sandbox's first node container."""
    node = make_settings(None, None).nodes[0].container
    path = f"{SHARED}/runs/{run_id}/{name}"
    cmd = ["docker", "exec", node, "cat", path]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench-balance: cannot read {path} on {node}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


if __name__ == "__main__":
    sys.exit(main())
