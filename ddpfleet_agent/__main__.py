"""``python -m ddpfleet_agent ... -- <command>``: see the package docstring."""

from __future__ import annotations

import os
import sys

from ddpfleet_agent import dump
from ddpfleet_agent.cli import BadAgentInput, parse_args
from ddpfleet_agent.supervise import Agent


def main(argv: list[str] | None = None) -> int:
    """Run the agent: its exit code (0 completed, 143 stopped, else failed); ``dump`` and
    ``index`` first: a forensics bundle of a live run instead (ddpfleet_agent.dump)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["dump"], ["index"]):
        return dump.main(argv)
    try:
        cfg = parse_args(argv)
    except BadAgentInput as exc:
        sys.stderr.write(f"ddpfleet_agent: error: {exc}\n")
        return 2
    # Nothing the run writes is world-readable (its logs carry the command line, which may
    # hold secrets): 0640 / 0750, readable by the storage owner's group.
    os.umask(0o027)
    return Agent(cfg).run()


if __name__ == "__main__":
    sys.exit(main())
