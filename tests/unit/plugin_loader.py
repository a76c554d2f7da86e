"""Import a role's plugin or module_utils file by path (they are not packages)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from time_bounds import within

ROOT = Path(__file__).resolve().parents[2]


def load_plugin(name: str, relative_path: str) -> ModuleType:
    """Load ROOT/relative_path as module `name` (registered in sys.modules, as dataclasses need).
    The role's module_utils files are registered first as ``ansible.module_utils.<name>``, the
    name its modules import them by. ``name`` must not be one of the repository's packages:
    registered under it, the plugin would stand in for the package in every later import."""
    if (ROOT / name / "__init__.py").is_file():
        raise ValueError(f"load_plugin: {name} is a package of this repository; pick another name")
    folder = (ROOT / relative_path).parent
    utils = [] if folder.name == "module_utils" else sorted(folder.parent.glob("module_utils/*.py"))
    for util in utils:
        if f"ansible.module_utils.{util.stem}" not in sys.modules:
            load_plugin(f"ansible.module_utils.{util.stem}", str(util.relative_to(ROOT)))
    spec = importlib.util.spec_from_file_location(name, ROOT / relative_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {relative_path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def node_shell(cmd: str, sudoable: bool = True) -> dict:
    """An action plugin's ``_low_level_execute_command`` on a node reached as a sudo user:
    run for real with /bin/sh, as root when it goes through become (``sudoable``), else as
    an unprivileged login (nobody) — what a non-root ``ansible_user`` gets. Needs root."""
    prefix = [] if sudoable else ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    proc = subprocess.run(
        [*prefix, "/bin/sh", "-c", cmd], capture_output=True, text=True, check=False
    )
    return {"rc": proc.returncode, "stdout": proc.stdout, "stderr": proc.stderr}


def local_playbook(book: Path, **env: str) -> str:
    """Run ``ansible-playbook`` on localhost with the repository's ansible.cfg (its stdout
    callback), from the playbook's directory, ``env`` added; returns its exit code's line and
    output, ``rc=<n>`` first."""
    run_env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "NO_COLOR": "1", **env}
    done = subprocess.run(
        [Path(sys.executable).with_name("ansible-playbook"), "-i", "localhost,", "-c", "local",
         "-e", f"ansible_python_interpreter={sys.executable}", str(book)],
        cwd=book.parent, env=run_env, capture_output=True, text=True, timeout=within(120),
        check=False,
    )  # fmt: skip
    return f"rc={done.returncode}\n{done.stdout}{done.stderr}"
