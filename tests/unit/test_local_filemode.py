"""The slurm role's controller-side munge key tasks are skipped on a read of the controller's
own files (roles/slurm/filter_plugins/local_filemode.py): only where the secrets directory is a
directory closed to others and the key a file only its owner reads. The role's own condition
is evaluated with the filter, against real files."""

from __future__ import annotations

from pathlib import Path

import jinja2
import yaml
from plugin_loader import ROOT, load_plugin

filemode = load_plugin("ddpfleet_local_filemode", "roles/slurm/filter_plugins/local_filemode.py")
GENERATE = "Generate the munge key on the controller"


def generates(secrets: Path) -> bool:
    """The munge.yml block's ``when``, with the role's key path."""
    tasks = yaml.safe_load((ROOT / "roles/slurm/tasks/munge.yml").read_text())
    when = next(t["when"] for t in tasks if t["name"] == GENERATE)
    env = jinja2.Environment(undefined=jinja2.StrictUndefined)
    env.filters.update(filemode.FilterModule().filters())
    key = yaml.safe_load((ROOT / "roles/slurm/vars/main.yml").read_text())["_slurm_munge_key_src"]
    key = env.from_string(key).render(ddpfleet_secrets_dir=str(secrets))
    return bool(
        env.compile_expression(when)(ddpfleet_secrets_dir=str(secrets), _slurm_munge_key_src=key)
    )


def test_the_mode_reads_as_ls_writes_it(tmp_path: Path) -> None:
    (tmp_path / "key").write_text("k")
    (tmp_path / "key").chmod(0o600)
    (tmp_path / "link").symlink_to(tmp_path / "key")
    assert filemode.local_filemode(tmp_path / "key") == "-rw-------"
    assert filemode.local_filemode(tmp_path / "link").startswith("l")  # not followed
    assert filemode.local_filemode(tmp_path / "none") == "missing"


def test_the_key_tasks_run_unless_the_directory_and_key_are_as_they_make_them(
    tmp_path: Path,
) -> None:
    secrets = tmp_path / ".secrets"
    assert generates(secrets)  # nothing there yet
    secrets.mkdir(mode=0o700)
    secrets.chmod(0o700)
    assert generates(secrets)  # no key
    key = secrets / "munge.key"
    key.write_text("k" * 128)
    key.chmod(0o644)
    assert generates(secrets)  # a key others may read
    key.chmod(0o600)
    assert not generates(secrets)
    secrets.chmod(0o755)
    assert generates(secrets)  # a directory others may list
