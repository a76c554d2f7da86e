"""Command line of the sandbox: ``python -m sandbox up|down|status``."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

import sandbox
from sandbox import cluster
from sandbox.dockercli import SandboxError
from sandbox.settings import make_settings


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        """Bad usage is one line, like every other error here."""
        print(f"sandbox: {message} (see 'python -m sandbox --help')", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="python -m sandbox",
        description=sandbox.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    up = sub.add_parser("up", help="create or repair the sandbox and write its inventory")
    down = sub.add_parser("down", help="remove every container, network, volume and key it made")
    status = sub.add_parser("status", help="show nodes, IPs and storage mode")
    sub.add_parser("images", help="build (or reuse) the node images that up needs, start nothing")
    for cmd in (up, down, status):
        cmd.add_argument("--nodes", help="number of nodes (env SANDBOX_NODES, default 3)")
        cmd.add_argument(
            "--subnet", help="private IPv4 subnet (env SANDBOX_SUBNET, default 10.213.97.0/24)"
        )
    up.add_argument(
        "--login",
        choices=("ops", "root"),
        help="who Ansible logs in as (env SANDBOX_LOGIN): ops, a sudo user as on real "
        "clusters (default), or root",
    )
    down.add_argument(
        "--purge", action="store_true", help="also remove the cached images and rootfs"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        given = {k: getattr(args, k, None) for k in ("subnet", "nodes", "login")}
        settings = make_settings(given["subnet"], given["nodes"], given["login"])
        if args.command == "up":
            cluster.up(settings)
        elif args.command == "down":
            cluster.down(settings, purge=args.purge)
        elif args.command == "images":
            cluster.build_images(settings)
        else:
            return cluster.status(settings)
    except SandboxError as exc:
        print(f"sandbox: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("sandbox: interrupted", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
