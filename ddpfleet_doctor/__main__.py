"""Entry point: ``python -m ddpfleet_doctor <compute|storage|network> ...`` (see
ddpfleet_doctor.cli)."""

from __future__ import annotations

import sys

from ddpfleet_doctor.cli import main

if __name__ == "__main__":
    sys.exit(main())
