"""ddpfleet_run_validate: every check of a run request, on the controller, before any host is
contacted (tasks/validate.yml, run_once). Fails with one line naming the option. The rules are
``trainer.request.first_problem`` and the functions it calls (plain Python, tested
in-process); the plugin takes no arguments: it reads the task's variables.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

from ansible.plugins.action import ActionBase

# The rules live in the trainer package next to the option declaration; on the controller it
# is this checkout's copy, first on the path: a controller venv may hold another "trainer".
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from trainer.request import first_problem


class ActionModule(ActionBase):
    """Validate the run request from the task's variables (no arguments, nothing changed)."""

    TRANSFERS_FILES = False
    _requires_connection = False

    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        variables = _Templated(task_vars, self._templar)
        found = first_problem(
            variables,
            list(variables.get("groups", {}).get("trainers", [])),
            list(variables.get("ansible_play_hosts_all", [])),
            task_vars["hostvars"],
        )
        if found:
            return {**result, "failed": True, "msg": found}
        return {**result, "changed": False, "msg": "run request is valid"}


class _Templated(Mapping):
    """The task's variables, each templated when read (role defaults may be templates)."""

    def __init__(self, variables: dict, templar: object) -> None:
        self._vars, self._templar = variables, templar

    def __getitem__(self, key: str) -> object:
        return self._templar.template(self._vars[key])  # type: ignore[attr-defined]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._vars)

    def __len__(self) -> int:
        return len(self._vars)
