"""``python -m ddpfleet_agent ... -- <command>``: see the package docstring."""

from __future__ import annotations

import os
import sys

from ddpfleet_agent.cli import BadAgentInput, parse_args


def main(argv: list[str] | None = None) -> int:
    """Run the agent; returns its exit code (0 completed, 143 stopped, else failed). ``dump``
    and ``index`` first: a forensics bundle of a live run instead (ddpfleet_agent.dump)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["dump"], ["index"]):
        from ddpfleet_agent import dump  # noqa: PLC0415 - the agent's own path imports torch

        return dump.main(argv)
    try:
        cfg = parse_args(argv)
    except BadAgentInput as exc:
        sys.stderr.write(f"ddpfleet_agent: error: {exc}\n")
        return 2
    # Nothing the run writes is world-readable (its logs carry the command line, whose
    # program arguments may be secrets): the agent's files and its ranks' are 0640 / 0750,
    # readable by the storage owner's group.
    os.umask(0o027)
    # The store client logs a C++ stack trace for every lost connection; the agent reports
    # those in one line itself. The ranks get the user's setting back.
    child_env = dict(os.environ)
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    from ddpfleet_agent.supervise import Agent  # noqa: PLC0415 - torch loads only for a valid call

    return Agent(cfg, child_env).run()


if __name__ == "__main__":
    sys.exit(main())
