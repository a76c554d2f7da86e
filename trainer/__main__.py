"""Entry point: ``python -m trainer`` (see the package docstring for launch commands)."""

from __future__ import annotations

import sys

from trainer.stop import StopFlag


def main(argv: list[str] | None = None) -> int:
    """Run the trainer; returns the process exit code (see docs/design.md)."""
    stop = StopFlag()
    stop.install()  # before torch loads (seconds on a busy host): no signal is lost at start-up
    from trainer.runner import run  # noqa: PLC0415 - imported after the handler is in place

    return run(argv, stop)


if __name__ == "__main__":
    sys.exit(main())
