"""Filters that let one task own /etc/docker/daemon.json.

``ddpfleet_daemon_json_merge`` deep-merges the keys ddpfleet manages into whatever the
file already holds, so keys written by someone else (an admin, ``nvidia-ctk runtime
configure``) survive. A managed key set to ``None`` is removed. The result is a plain
dict; render it with ``to_nice_json`` (sorted keys), so the text is deterministic.

``ddpfleet_daemon_json_parse`` reads the file's text ('' means no file) into a dict, so
the role can compare content rather than formatting and leave a file alone whose
meaning already matches.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

from ansible.errors import AnsibleFilterError


def daemon_json_parse(text: Any) -> dict[str, Any]:
    """Return daemon.json's text as a dict; empty or whitespace text is ``{}``."""
    if isinstance(text, Mapping):
        return copy.deepcopy(dict(text))
    if text is None:
        return {}
    if not isinstance(text, str):
        raise AnsibleFilterError(
            f"daemon.json must be given as text or a mapping, not {type(text).__name__}"
        )
    if not text.strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise AnsibleFilterError(
            f"daemon.json is not valid JSON (line {exc.lineno}, column {exc.colno}): {exc.msg}"
        ) from None
    if not isinstance(data, dict):
        raise AnsibleFilterError(
            f"daemon.json must hold a JSON object, found {type(data).__name__}"
        )
    return data


def _merge(base: dict[str, Any], managed: Mapping[str, Any]) -> dict[str, Any]:
    for key, value in managed.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(base.get(key), dict):
            base[key] = _merge(base[key], value)
        elif isinstance(value, Mapping):
            base[key] = _merge({}, value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def daemon_json_merge(existing: Any, managed: Any) -> dict[str, Any]:
    """Deep-merge ``managed`` into ``existing`` (text or mapping); keep other keys."""
    if not isinstance(managed, Mapping):
        raise AnsibleFilterError(
            f"managed daemon.json keys must be a mapping, not {type(managed).__name__}"
        )
    merged = _merge(daemon_json_parse(existing), managed)
    return json.loads(json.dumps(merged, sort_keys=True))


class FilterModule:
    """Ansible entry point."""

    def filters(self) -> dict[str, Any]:
        return {
            "ddpfleet_daemon_json_merge": daemon_json_merge,
            "ddpfleet_daemon_json_parse": daemon_json_parse,
        }
