"""roles/trainer_image's ddpfleet_build_status: async_status of the image build, with the step
the build is at while it runs (read from `docker ps`), and async_status's result untouched
otherwise."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from ansible.errors import AnsibleConnectionFailure
from plugin_loader import ROOT, load_plugin, local_playbook

status = load_plugin(
    "ddpfleet_build_status_action", "roles/trainer_image/action_plugins/ddpfleet_build_status.py"
)

# What `docker ps --no-trunc --format '{{.Command}}'` shows on the registry host mid-build:
# the registry's container and the classic builder's container of the RUN step that runs.
PS = (
    '"/entrypoint.sh /etc/docker/registry/config.yml"\n'
    "\"/bin/sh -c 'python /opt/ddpfleet/build/layers.py install 3'\"\n"
)


def test_the_image_has_as_many_layers_as_the_dockerfile_installs() -> None:
    dockerfile = (ROOT / "images" / "trainer" / "Dockerfile").read_text()
    assert status.layer_count() == str(dockerfile.count("layers.py install "))
    assert status.layer_count(Path("/nonexistent/Dockerfile")) == "?"


BUILD = "/bin/sh -c 'python /opt/ddpfleet/build/layers.py"
JPEG = "/bin/sh -c 'set -eu; apt-get update; cc -o /out/x.so /build/jpegcrop.c'"
TRAINER = "/bin/sh -c 'chmod -R a+rX /opt/ddpfleet/dist && pip install /opt/ddpfleet/dist/x.whl'"


@pytest.mark.parametrize(
    ("command", "step"),
    [
        (f"{BUILD} install 3'", "installing the Python stack (3/6)"),
        (f"{BUILD} plan'", "resolving the Python stack"),
        (JPEG, "building the JPEG decoder"),
        ("/bin/sh -c 'set -eu; pkgs=\"\"; apt-get install -y $pkgs'", "installing system packages"),
        (TRAINER, "installing the trainer"),
        ("/bin/sh -c 'python /opt/ddpfleet/versions.py'", "reading torch, CUDA, cuDNN and NCCL"
         " versions"),
        ("/entrypoint.sh /etc/docker/registry/config.yml", ""),
    ],
)  # fmt: skip
def test_describe(command: str, step: str) -> None:
    assert status.describe(command, "6") == step


def action(polled: dict, probe: Any) -> tuple[Any, mock.MagicMock]:
    """The action with async_status answering ``polled`` and `docker ps` answering ``probe``
    (a result, or an exception to raise)."""
    task = mock.MagicMock()
    task.args = {"jid": "j1"}
    loader = mock.MagicMock()
    loader.action_loader.get.return_value.run.return_value = dict(polled)
    act = status.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None, None)
    act._shared_loader_obj = loader  # ansible-core sets its own plugin loaders here
    ps = (
        mock.MagicMock(side_effect=probe)
        if isinstance(probe, Exception)
        else mock.MagicMock(return_value=probe)
    )
    act._low_level_execute_command = ps
    return act, ps


def test_a_running_build_gets_its_step() -> None:
    act, ps = action({"started": True, "finished": False}, {"rc": 0, "stdout": PS})
    result = act.run(task_vars={})
    assert result == {
        "started": True,
        "finished": False,
        "build_step": "installing the Python stack (3/6)",
    }
    assert ps.call_args.args[0] == status.PROBE
    name = act._shared_loader_obj.action_loader.get.call_args.args[0]
    assert name == "ansible.builtin.async_status"


@pytest.mark.parametrize(
    "polled",
    [
        {"started": True, "finished": True, "changed": True},
        {"started": True, "finished": True, "failed": True, "msg": "the build failed"},
    ],
)
def test_an_ended_build_is_async_status_s_result_alone(polled: dict) -> None:
    act, ps = action(polled, {"rc": 0, "stdout": PS})
    assert act.run(task_vars={}) == polled
    ps.assert_not_called()


@pytest.mark.parametrize(
    "probe",
    [
        {"rc": 127, "stdout": "", "stderr": "docker: not found"},
        {"rc": 0, "stdout": '"/entrypoint.sh /etc/docker/registry/config.yml"\n'},
        AnsibleConnectionFailure("lost"),
    ],
)
def test_a_probe_that_finds_nothing_leaves_the_poll_as_it_was(probe: Any) -> None:
    act, _ = action({"started": True, "finished": False}, probe)
    assert act.run(task_vars={}) == {"started": True, "finished": False}


PLAYBOOK = """
- name: Wait for background jobs as wait.yml does
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Start a job that ends well
      ansible.builtin.command: sleep 1
      async: 60
      poll: 0
      register: good
      changed_when: false
    - name: Start a job that fails
      ansible.builtin.command: "false"
      async: 60
      poll: 0
      register: bad
      changed_when: false
    - name: Wait for the good job
      ddpfleet_build_status:
        jid: "{{ good.ansible_job_id }}"
      register: good_done
      until: good_done.finished
      retries: 20
      delay: 1
    - name: Wait for the bad job
      ddpfleet_build_status:
        jid: "{{ bad.ansible_job_id }}"
      register: bad_done
      until: bad_done.finished
      retries: 20
      delay: 1
"""


def test_ansible_playbook_waits_on_real_jobs(tmp_path: Path) -> None:
    """Real async jobs on localhost: the action polls them as async_status does, and the job
    that failed fails the wait with its error."""
    book = tmp_path / "wait.yml"
    book.write_text(PLAYBOOK)
    out = local_playbook(
        book,
        ANSIBLE_ACTION_PLUGINS=str(ROOT / "roles" / "trainer_image" / "action_plugins"),
        ANSIBLE_ASYNC_DIR=str(tmp_path / "async"),
    )
    assert out.startswith("rc=2\n"), out[-3000:]
    assert "TASK [Wait for the good job]" in out
    good = out.split("TASK [Wait for the good job]", 1)[1].split("TASK [", 1)[0]
    assert "[localhost]" in good, out[-3000:]
    assert "fatal" not in good, out[-3000:]
    bad = out.split("TASK [Wait for the bad job]", 1)[1]
    assert "fatal: [localhost]: FAILED! => " in bad, out[-3000:]
    assert "non-zero return code" in bad, out[-3000:]
    assert "RETRYING" not in out
