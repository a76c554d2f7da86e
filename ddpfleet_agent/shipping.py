"""The run agent as train.yml ships it into a run directory for a user's program, whose image
need not hold this package: one compressed tar that a single task on node rank 0's host unpacks
into the run's ``lib/`` (a copy task per module took 16 s of such a launch on the sandbox, this
one 0.4 s). Runs on the controller (the trainer_run filter ``ddpfleet_agent_lib``)."""

from __future__ import annotations

import base64
import io
import tarfile
from pathlib import Path

DIRS = ("agent", "agent/ddpfleet_agent")


def lib_archive(package: str | Path) -> str:
    """base64 of a .tar.gz of ``package`` (the ddpfleet_agent directory) laid out as the run's
    lib/: agent/ddpfleet_agent/*.py and ddpfleet_heartbeat.py (for the ranks' PYTHONPATH), with
    their sources' mtimes, so a changed module never meets a stale .pyc of the same size."""
    package = Path(package)
    files = {f"{DIRS[-1]}/{p.name}": p for p in sorted(package.glob("*.py"))}
    files["ddpfleet_heartbeat.py"] = package / "ddpfleet_heartbeat.py"
    entries = [(name, package, None) for name in DIRS]
    entries += [(name, path, path.read_bytes()) for name, path in files.items()]
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for name, path, data in entries:
            info = tarfile.TarInfo(name)
            info.mtime = int(path.stat().st_mtime)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
            else:
                info.mode, info.size = 0o644, len(data)
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return base64.b64encode(buf.getvalue()).decode("ascii")
