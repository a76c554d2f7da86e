"""Filters of the doctor role (controller side, pure Python) on a doctor container's output:
its JSON line, and the line naming the cause when it failed (container.yml). The report is
ddpfleet_doctor.py's, the table ddpfleet_doctor_table.py's."""

from __future__ import annotations

import json
import re


def result(output: object) -> dict:
    """The last line of a container's output that is a JSON object ({} when there is none)."""
    for raw in reversed(str(output or "").splitlines()):
        line = raw.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                return value
    return {}


# ddpfleet_doctor's own one line ("doctor network: ..."), behind torchrun's "[rank0]:" if any.
_RANK_PREFIX = re.compile(r"^\[(?:default)?rank\d+\]:\s*")
_DOCTOR_LINE = re.compile(r"^doctor (?:compute|storage|network): ")
# The last line of a Python traceback ("MemoryError: ..."); torchrun's own is no cause.
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b:?")
_LAUNCHER = "ChildFailedError"
# torchrun's box when a rank died without a word (a signal, the OOM killer): its exit code.
_EXITCODE_LINE = re.compile(r"^exitcode\s*:")


def error(output: object, status: object = None) -> str:
    """The line of a failed container's output that names the cause: ddpfleet_doctor's one
    line, else the last exception of a traceback, else torchrun's exit code of the rank,
    else the last line with words in it (not a separator such as torchrun's '=====')."""
    lines = [_RANK_PREFIX.sub("", raw).strip() for raw in str(output or "").splitlines()]
    lines = [line for line in lines if line]
    for wanted in (
        _DOCTOR_LINE.match,
        lambda line: _EXCEPTION_LINE.match(line) and _LAUNCHER not in line,
        _EXITCODE_LINE.match,
        lambda line: re.search(r"\w", line),
    ):
        found = [line for line in lines if wanted(line)]
        if found:
            return " ".join(found[-1].split())
    return f"the container printed nothing to name (status {status})"


class FilterModule:
    """ddpfleet doctor filters on a container's output."""

    def filters(self) -> dict:
        return {
            "ddpfleet_doctor_result": result,
            "ddpfleet_doctor_error": error,
        }
