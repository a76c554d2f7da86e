"""ddpfleet's screen output: Ansible's default, except that a wait reads as progress.

Ansible's default callback prints every retry of an ``until:`` loop as ``FAILED - RETRYING:
[host]: task (N retries left)``, so a healthy wait (the image build, Prometheus starting, Slurm's
nodes coming up, a run's containers going) printed FAILED every few seconds. Here a retry
prints a progress line instead, at most one a minute per task and host, with the time waited::

    image build: installing the Python stack (3/6) on node1, 3 min 10 s
    waiting: [node1]: Wait for Prometheus to be ready on its cluster address (20 s)

(the image build's step comes with each poll: roles/trainer_image's ddpfleet_build_status;
a new step is shown at once).

A real failure (the last retry's included) prints exactly as the default callback prints it.
ansible.cfg sets it as ``stdout_callback``.
"""

from __future__ import annotations

import time
from typing import Any

from ansible import constants as C
from ansible.plugins.callback.default import CallbackModule as DefaultCallback

DOCUMENTATION = """
    name: ddpfleet
    type: stdout
    short_description: Ansible's default output, with waits shown as progress
    description:
        - The default stdout callback, except that a retry of an until loop prints a progress
          line (at most one a minute per task and host, and at once for a new step of the
          image build) instead of "FAILED - RETRYING".
    extends_documentation_fragment:
      - default_callback
      - result_format_callback
    requirements:
      - set as stdout_callback in ansible.cfg
"""

# Waits with a short label of their own, by the start of their task's name.
LABELS = {"Wait for the image build": "image build"}
EVERY = 60.0  # seconds between two progress lines of the same wait


def elapsed(seconds: float) -> str:
    """``45 s``, ``3 min 10 s``, ``12 min``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, rest = divmod(whole, 60)
    return f"{minutes} min {rest} s" if rest else f"{minutes} min"


def progress_line(task_name: str, host: str, waited: float, where: str = "", step: str = "") -> str:
    """The line a retry prints: the wait's label and how long it has waited; never FAILED.
    ``host`` is Ansible's label (``node2 -> node1`` for a delegated task), ``where`` the host
    the task runs on and ``step`` what the awaited work is doing, both named in a labelled
    wait."""
    for prefix, label in LABELS.items():
        if task_name.startswith(prefix):
            doing = f"{step} on" if step else "running on"
            return f"{label}: {doing} {where or host}, {elapsed(waited)}"
    return f"waiting: [{host}]: {task_name} ({elapsed(waited)})"


class CallbackModule(DefaultCallback):
    CALLBACK_VERSION = 2.0
    CALLBACK_TYPE = "stdout"
    CALLBACK_NAME = "ddpfleet"

    def __init__(self, clock: Any = time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._waits: dict[tuple[str, str], list[float]] = {}  # (task, host): [start, last line]
        self._steps: dict[tuple[str, str], str] = {}  # (task, host): the step last reported

    def v2_runner_retry(self, result: Any) -> None:
        task_name = result.task_name or result.task.get_name()
        host = self.host_label(result)
        now = self._clock()
        key = (result.task._uuid, host)
        if key not in self._waits:
            # The first retry comes one delay after the first try began.
            self._waits[key] = [now - float(result.task.delay or 0), float("-inf")]
        started, last = self._waits[key]
        # The awaited work's step (the image build's: ddpfleet_build_status), kept between
        # polls that saw none; a new step is shown at once.
        step = str(result.result.get("build_step") or self._steps.get(key, ""))
        new_step = step != self._steps.get(key, "")
        self._steps[key] = step
        if now - last < EVERY and not new_step:
            return
        self._waits[key][1] = now
        where = result.task.delegate_to or result.host.get_name()
        line = progress_line(task_name, host, now - started, str(where), step)
        self._display.display(line, color=C.COLOR_DEBUG)
