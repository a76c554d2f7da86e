"""``ddpfleet_local_filemode``: a path's type and permissions on the controller, as ``ls -l``
writes them ("drwx------", "-rw-------"; "missing" where there is nothing), read in the
controller's own process. The slurm role skips its controller-side munge key tasks where the
secrets directory and the key are already as those tasks make them: each task would otherwise
cost a module run on the controller in every site.yml."""

from __future__ import annotations

import os
import stat
from typing import Any


def local_filemode(path: Any) -> str:
    """``stat.filemode`` of ``path``, not following a link; "missing" if there is none."""
    try:
        return stat.filemode(os.lstat(os.path.expanduser(str(path))).st_mode)
    except FileNotFoundError:
        return "missing"


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {"ddpfleet_local_filemode": local_filemode}
