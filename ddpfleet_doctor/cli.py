"""Cluster checks for ``ansible-playbook doctor.yml``: each prints one JSON line on stdout.

Compute (training steps/s and img/s of the run's model on synthetic data; on a GPU host one
process per GPU, with nvidia-smi health sampled while they run)::

    python -m ddpfleet_doctor compute --arch resnet50 --image-size 224 --batch-size 0 --amp auto

doctor.yml gives every host ``--start-line 10.0.0.1:29601:3`` (the first host also
``--serve-start-line``): the hosts warm up, then time their steps over the same seconds.

Storage (read MB/s and PIL-decoded JPEGs/s of the shared dataset directory, see
ddpfleet_doctor.storage)::

    python -m ddpfleet_doctor storage --data-dir /mnt/ddpfleet/datasets --host-index 0 --hosts 3

Network (all-reduce bus bandwidth and TCP throughput per pair of hosts, see
ddpfleet_doctor.network), under torchrun on every host; rank 0 prints::

    torchrun ... -m ddpfleet_doctor network --names n1,n2 --addresses 10.0.0.1,10.0.0.2

Bad input: one line on stderr, exit 2; a failed measurement: one line, exit 1.
"""

from __future__ import annotations

import argparse
import json
import sys
import traceback

from ddpfleet_doctor import startline
from ddpfleet_doctor.compute import CPU_BATCH, GPU_BATCH, compute


def get_args_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ddpfleet_doctor", description=__doc__.splitlines()[0]
    )
    sub = parser.add_subparsers(dest="check", required=True)
    c = sub.add_parser("compute", help="training steps/s and img/s on synthetic data")
    c.add_argument("--arch", default="resnet50")
    c.add_argument("--image-size", type=int, default=224)
    c.add_argument(
        "--batch-size",
        type=int,
        default=0,
        help=f"per process; 0: {GPU_BATCH} per GPU, {CPU_BATCH} on the CPU",
    )
    c.add_argument("--amp", default="auto", choices=["auto", "bf16", "fp16", "off"])
    c.add_argument("--channels-last", action=argparse.BooleanOptionalAction, default=True)
    c.add_argument(
        "--gpus", type=int, default=-1, help="processes, one per GPU; 0: the CPU; -1: every GPU"
    )
    c.add_argument(
        "--warmup", type=int, default=3, help="untimed steps (at most half of --seconds)"
    )
    c.add_argument("--seconds", type=float, default=8.0, help="timed steps run at least this long")
    c.add_argument("--max-steps", type=int, default=50)
    c.add_argument(
        "--start-line",
        default="",
        metavar="ADDRESS:PORT:COUNT",
        help="start timing when all COUNT processes (one per GPU, else one per host) are warmed"
        " up: the line served at ADDRESS:PORT (ddpfleet_doctor.startline); empty: at once",
    )
    c.add_argument(
        "--serve-start-line", action="store_true", help="this host serves the line (one host)"
    )
    c.add_argument(
        "--start-timeout",
        type=float,
        default=startline.TIMEOUT,
        help="seconds the line waits for the last process's warm-up",
    )
    s = sub.add_parser("storage", help="read MB/s and decoded JPEGs/s of a directory")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--host-index", type=int, default=0)
    s.add_argument("--hosts", type=int, default=1)
    s.add_argument("--files", type=int, default=300)
    s.add_argument("--seconds", type=float, default=4.0)
    n = sub.add_parser(
        "network", help="all-reduce busbw and TCP throughput per host pair (torchrun)"
    )
    n.add_argument("--names", required=True, help="host names, comma-separated, in node-rank order")
    n.add_argument(
        "--addresses", required=True, help="their addresses for the pair tests, same order"
    )
    n.add_argument("--allreduce-mb", type=float, default=16.0)
    n.add_argument("--iters", type=int, default=5)
    n.add_argument("--pair-seconds", type=float, default=1.0)
    n.add_argument(
        "--backend",
        default="",
        choices=["", "gloo", "nccl"],
        help="default: nccl on GPUs, else gloo",
    )
    n.add_argument("--timeout", type=float, default=120.0, help="seconds any collective may wait")
    return parser


def _check_numbers(args) -> None:
    positive = {
        "compute": ("image_size", "seconds", "max_steps", "start_timeout"),
        "storage": ("files", "seconds", "hosts"),
        "network": ("allreduce_mb", "iters", "pair_seconds", "timeout"),
    }[args.check]
    for name in positive:
        if getattr(args, name) <= 0:
            raise ValueError(
                f"--{name.replace('_', '-')} must be positive, not {getattr(args, name)}"
            )
    if getattr(args, "start_line", ""):
        startline.parse(args.start_line)
    if getattr(args, "batch_size", 0) < 0:
        raise ValueError(f"--batch-size must be 0 or more, not {args.batch_size}")


def main(argv: list[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    try:
        _check_numbers(args)
    except ValueError as exc:
        print(f"doctor {args.check}: {exc}", file=sys.stderr)
        return 2
    try:
        if args.check == "compute":
            result = compute(args)
        elif args.check == "storage":
            from ddpfleet_doctor import storage  # noqa: PLC0415 - no torch for storage

            result = storage.run(
                args.data_dir, args.host_index, args.hosts, args.files, args.seconds
            )
        else:
            from ddpfleet_doctor import network  # noqa: PLC0415

            result = network.run(args)
    except Exception as exc:  # any failure: one line naming it, not a traceback
        bad_input = type(exc).__name__ == "BadInputError"
        line = str(exc) if bad_input else traceback.format_exception_only(type(exc), exc)[-1]
        print(f"doctor {args.check}: {line.strip().splitlines()[0]}", file=sys.stderr)
        return 2 if bad_input else 1
    if result is not None:
        print(json.dumps(result, sort_keys=True), flush=True)
    return 0
