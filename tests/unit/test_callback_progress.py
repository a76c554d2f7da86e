"""callback_plugins/ddpfleet.py: a wait's retry prints progress, never FAILED; a failure prints
as Ansible's default callback prints it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from ansible.plugins.loader import callback_loader
from plugin_loader import ROOT, load_plugin, local_playbook

progress = load_plugin("ddpfleet_progress_callback", "callback_plugins/ddpfleet.py")


class Screen:
    """Stands in for Ansible's Display: keeps each line the callback shows."""

    verbosity = 0

    def __init__(self) -> None:
        self.lines: list[str] = []

    def display(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append(msg)

    def banner(self, msg: str, *args: Any, **kwargs: Any) -> None:
        self.lines.append(msg)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def task(name: str, delay: float = 5) -> SimpleNamespace:
    return SimpleNamespace(
        _uuid=f"uuid-{name}", get_name=lambda: name, delay=delay, delegate_to=None,
        action="ansible.builtin.async_status", loop=None, no_log=False,
    )  # fmt: skip


def result(the_task: SimpleNamespace, host: str, **values: Any) -> SimpleNamespace:
    return SimpleNamespace(
        task=the_task, _task=the_task, task_name=the_task.get_name(),
        host=SimpleNamespace(get_name=lambda: host), result=dict(values), _result=dict(values),
        warnings=[], deprecations=[], exception=None,
    )  # fmt: skip


@pytest.fixture
def callback() -> tuple[Any, Screen, Clock]:
    """The plugin as ansible-playbook loads it (by name, from ansible.cfg's callback_plugins,
    with its options), drawing on a fake screen and clock."""
    callback_loader.add_directory(str(ROOT / "callback_plugins"))
    cb = callback_loader.get("ddpfleet")
    assert cb is not None, "ansible cannot load callback_plugins/ddpfleet.py"
    cb.set_options()
    screen, clock = Screen(), Clock()
    cb._display, cb._clock = screen, clock
    return cb, screen, clock


def test_ansible_cfg_sets_it_as_the_stdout_callback() -> None:
    cfg = (ROOT / "ansible.cfg").read_text()
    assert "\nstdout_callback = ddpfleet\n" in cfg
    assert "\ncallback_plugins = callback_plugins\n" in cfg


def test_a_retry_prints_progress_and_no_failed(callback: tuple[Any, Screen, Clock]) -> None:
    cb, screen, _clock = callback
    build = task("Wait for the image build (its log prints torch, CUDA, cuDNN and NCCL versions)")
    cb.v2_runner_retry(result(build, "node1", retries=356, attempts=1))
    assert screen.lines == ["image build: running on node1, 5 s"]


def test_a_delegated_build_names_the_host_it_runs_on(callback: tuple[Any, Screen, Clock]) -> None:
    cb, screen, _clock = callback
    build = task("Wait for the image build (its log prints torch, CUDA, cuDNN and NCCL versions)")
    build.delegate_to = "node1"
    cb.v2_runner_retry(result(build, "node2", retries=356, attempts=1))
    assert screen.lines == ["image build: running on node1, 5 s"]


def test_the_build_s_steps_show_at_once_and_are_kept(callback: tuple[Any, Screen, Clock]) -> None:
    """ddpfleet_build_status's build_step: a new step is shown at once, the same one once a
    minute, and a poll that saw no step (between two) keeps the last."""
    cb, screen, clock = callback
    build = task("Wait for the image build (its log prints torch, CUDA, cuDNN and NCCL versions)")
    steps = ["resolving the Python stack", "", "installing the Python stack (1/6)"]
    steps += ["installing the Python stack (1/6)"] * 14 + [""] * 3
    for attempt, step in enumerate(steps, start=1):
        cb.v2_runner_retry(result(build, "node1", retries=356, attempts=attempt, build_step=step))
        clock.now += 5
    assert screen.lines == [
        "image build: resolving the Python stack on node1, 5 s",
        "image build: installing the Python stack (1/6) on node1, 15 s",
        "image build: installing the Python stack (1/6) on node1, 1 min 15 s",
    ]


def test_a_wait_prints_at_most_one_line_a_minute(callback: tuple[Any, Screen, Clock]) -> None:
    cb, screen, clock = callback
    ready = task("Wait for Prometheus to be ready on its cluster address", delay=2)
    for attempt in range(1, 40):  # 2 s apart: 78 s of waiting
        cb.v2_runner_retry(result(ready, "node1", retries=30, attempts=attempt))
        clock.now += 2
    assert screen.lines == [
        "waiting: [node1]: Wait for Prometheus to be ready on its cluster address (2 s)",
        "waiting: [node1]: Wait for Prometheus to be ready on its cluster address (1 min 2 s)",
    ]
    assert not any("FAILED" in line or "retries left" in line for line in screen.lines)


def test_each_host_waits_on_its_own(callback: tuple[Any, Screen, Clock]) -> None:
    cb, screen, _clock = callback
    gone = task("Wait until this host's container of the run is gone", delay=1)
    cb.v2_runner_retry(result(gone, "node1", retries=40, attempts=1))
    cb.v2_runner_retry(result(gone, "node2", retries=40, attempts=1))
    assert [line.split("]")[0] for line in screen.lines] == ["waiting: [node1", "waiting: [node2"]


def test_a_failure_still_prints_failed(callback: tuple[Any, Screen, Clock]) -> None:
    cb, screen, _clock = callback
    build = task("Wait for the image build (its log prints torch, CUDA, cuDNN and NCCL versions)")
    cb._last_task_banner = build._uuid  # its banner was printed when the task started
    cb.v2_runner_on_failed(result(build, "node1", failed=True, msg="the build failed: exit 1"))
    assert len(screen.lines) == 1
    assert screen.lines[0].startswith("fatal: [node1]: FAILED! => ")
    assert "the build failed: exit 1" in screen.lines[0]


PLAYBOOK = """
- name: Wait, then fail
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Wait for the third try
      ansible.builtin.shell: echo . >> tries; test "$(wc -l < tries)" -ge 3
      args: {chdir: "%(dir)s"}
      register: tried
      until: tried.rc == 0
      retries: 4
      delay: 0
      changed_when: false
    - name: Wait for what never comes
      ansible.builtin.command: "false"
      register: never
      until: never.rc == 0
      retries: 1
      delay: 0
      changed_when: false
"""


def test_ansible_playbook_with_the_repository_config(tmp_path: Path) -> None:
    """ansible-playbook itself, with ansible.cfg, from another directory: the retries read as
    progress, and the wait that runs out fails with the default callback's FAILED! line."""
    book = tmp_path / "wait.yml"
    book.write_text(PLAYBOOK % {"dir": tmp_path})
    out = local_playbook(book)
    assert out.startswith("rc=2\n"), out[-3000:]
    assert "waiting: [localhost]: Wait for the third try (0 s)" in out, out[-3000:]
    assert "waiting: [localhost]: Wait for what never comes (0 s)" in out, out[-3000:]
    assert "RETRYING" not in out
    assert [line for line in out.splitlines() if "FAILED" in line] == [
        line for line in out.splitlines() if line.startswith("fatal: [localhost]: FAILED! => ")
    ]
    assert out.count("fatal: [localhost]: FAILED! => ") == 1


@pytest.mark.parametrize(
    ("seconds", "text"), [(0, "0 s"), (59.9, "59 s"), (60, "1 min"), (190, "3 min 10 s")]
)
def test_elapsed(seconds: float, text: str) -> None:
    assert progress.elapsed(seconds) == text
