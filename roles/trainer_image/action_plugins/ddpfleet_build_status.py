"""ddpfleet_build_status: one poll of the background image build, with the step it is at.

wait.yml polls the build start.yml began (``community.docker.docker_image``, async) until it
has finished. Each poll is ``ansible.builtin.async_status``'s own: the same result, and the same
failure with the build's error. While the build runs, the result also holds ``build_step``:
what the classic builder's running RUN step does, read from ``docker ps`` on the build host
(``installing the Python stack (3/6)``), which the screen output (callback_plugins/ddpfleet.py)
prints as the wait's progress. The probe reads only; where it fails or no known step runs
(between steps, committing a layer), ``build_step`` is left out and the poll goes on as it was.
"""

from __future__ import annotations

import re
from pathlib import Path

from ansible.errors import AnsibleError
from ansible.plugins.action import ActionBase

# The commands of the build's RUN steps (images/trainer/Dockerfile), as `docker ps` shows the
# classic builder's container of the step that runs, and what they do, in words.
STEPS = (
    (re.compile(r"layers\.py install (\d+)"), "installing the Python stack ({0}/{total})"),
    (re.compile(r"layers\.py plan"), "resolving the Python stack"),
    (re.compile(r"jpegcrop"), "building the JPEG decoder"),
    (re.compile(r"apt-get"), "installing system packages"),
    (re.compile(r"/opt/ddpfleet/dist/"), "installing the trainer"),
    (re.compile(r"versions\.py"), "reading torch, CUDA, cuDNN and NCCL versions"),
)
PROBE = "docker ps --no-trunc --format '{{.Command}}'"
DOCKERFILE = Path(__file__).resolve().parents[3] / "images" / "trainer" / "Dockerfile"


def layer_count(dockerfile: Path = DOCKERFILE) -> str:
    """How many ``layers.py install N`` steps the image has ("?" where it cannot be read)."""
    try:
        text = dockerfile.read_text()
    except OSError:
        return "?"
    return str(len(re.findall(r"^RUN .*layers\.py install \d+", text, re.M)) or "?")


def describe(commands: str, total: str) -> str:
    """The build's step, in words, from `docker ps`'s commands; "" where none is known."""
    for line in commands.splitlines():
        for pattern, words in STEPS:
            found = pattern.search(line)
            if found:
                return words.format(*found.groups(), total=total)
    return ""


class ActionModule(ActionBase):
    def run(self, tmp: object = None, task_vars: dict | None = None) -> dict:
        status = self._shared_loader_obj.action_loader.get(
            "ansible.builtin.async_status",
            task=self._task,
            connection=self._connection,
            play_context=self._play_context,
            loader=self._loader,
            templar=self._templar,
            shared_loader_obj=self._shared_loader_obj,
        )
        result = status.run(task_vars=task_vars)
        if result.get("finished") or result.get("failed"):
            return result
        try:
            probe = self._low_level_execute_command(PROBE, sudoable=True)
        except AnsibleError:
            return result
        if probe.get("rc") == 0:
            step = describe(probe.get("stdout", ""), layer_count())
            if step:
                result["build_step"] = step
        return result
