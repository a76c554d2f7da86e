"""ddpfleet_agent/follow.py and its plugin, roles/trainer_run/action_plugins/ddpfleet_run_follow.py:
the read command (ddpfleet_agent/reader.py, run for real with /bin/sh on a run directory,
its wait for the end included), parsing, outcomes (progress.json's status word, which the
agents write: tests/unit/agent), the progress and status lines, and the follow loop fed with
fake command results."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import pytest
from ansible.errors import AnsibleError
from fake_clock import Clock
from plugin_loader import load_plugin, node_shell
from time_bounds import within

from ddpfleet_agent import follow as view

follow = load_plugin(
    "ddpfleet_run_follow", "roles/trainer_run/action_plugins/ddpfleet_run_follow.py"
)
HOSTS = ["node1", "node2", "node3"]


def exit_rec(host: str, outcome: str = "completed", attempt: str = "a2", **more) -> dict:
    code = {"completed": 0, "stopped": 143}.get(outcome, 1)
    return {"host": host, "attempt": attempt, "exit_code": code, "outcome": outcome, **more}


def progress(step: int = 40, attempt: str = "a2", **more) -> dict:
    rec = {
        "run_id": "r",
        "attempt": attempt,
        "state": "running",
        "status": "running",
        "step": step,
        "total_steps": 100,
        "phase": "train",
        "loss": 6.12344,
        "images_per_sec": 55.21,
        "eta_sec": 65.4,
        "hosts": dict.fromkeys(HOSTS, "running"),
    }
    return {**rec, **more}


def files(exits=(), summary=None, prog=None, attempt="a2") -> dict:
    out = {"config.json": {"run_id": "r", "attempt": attempt}}
    out.update({f"nodes/{e['host']}.exit": e for e in exits})
    if summary is not None:
        out["summary.json"] = summary
    if prog is not None:
        out["progress.json"] = prog
    return out


def snap(**kw) -> dict:
    return view.snapshot(files(**kw), "r", HOSTS, "")


def ended(status: str, **more) -> dict:
    """node rank 0's last progress.json: the run's status word."""
    return progress(step=2, state="ended", status=status, **more)


# --- the read ------------------------------------------------------------------------------


NOBODY = 65534


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory the reader can reach after dropping to nobody (pytest's tmp_path is 0700)."""
    path = Path(tempfile.mkdtemp(prefix="ddpfleet-follow-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


def read(run_dir: Path, uid: int = NOBODY, gid: int = NOBODY, wait: float = 0.0) -> dict:
    cmd = view.read_command(str(run_dir), uid, gid, wait)
    proc = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=True)
    return view.parse(proc.stdout)


def write_atomic(path: Path, text: str) -> None:
    """As the agents write their records: a temp file, then os.replace."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def test_read_command_prints_every_record_and_parse_reads_them_back(open_dir: Path):
    run_dir = open_dir / "run dir's"  # quoting: a space and a quote in the path
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "config.json").write_text('{"attempt": "a2"}')
    (run_dir / "summary.json").write_text('{"status": "comp')  # torn while written
    (run_dir / "nodes" / "node1.exit").write_text(json.dumps(exit_rec("node1")))
    (run_dir / "nodes" / "node1.log").write_text("not read")  # only its size
    (run_dir / "nodes" / "node2.log").symlink_to("/etc/hostname")  # no size through a link
    assert read(run_dir) == {
        "config.json": {"attempt": "a2"},
        "summary.json": {},
        "nodes/node1.exit": exit_rec("node1"),
        "logged": {"logged": ["node1.log 8"]},
        "links": {"links": ["nodes/node2.log"]},
    }


def test_links_planted_among_ddpfleet_s_files_are_named_and_not_followed(open_dir: Path):
    """What a program in the run's container could plant: a record, a directory, a file in
    lib/ turned into links. The reader names each (train.yml refuses the run) and reads no
    record through them; the program's own links elsewhere are its business."""
    run_dir = open_dir / "run"
    (run_dir / "lib" / "agent").mkdir(parents=True)
    (run_dir / "elsewhere").mkdir()
    (open_dir / "other.json").write_text('{"attempt": "theirs"}')
    (run_dir / "config.json").symlink_to(open_dir / "other.json")
    (run_dir / "nodes").symlink_to(run_dir / "elsewhere")
    (run_dir / "lib" / "agent" / "x.py").symlink_to("/etc/hostname")
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "latest.pt").symlink_to("step-1.pt")  # a program's own: fine
    files = read(run_dir)
    assert files == {"links": {"links": ["config.json", "nodes", "lib/agent/x.py"]}}
    assert view.snapshot(files, "r", HOSTS, "")["links"] == ["config.json", "nodes",
                                                             "lib/agent/x.py"]  # fmt: skip
    (run_dir / "config.json").unlink()
    (run_dir / "nodes").unlink()
    (run_dir / "lib" / "agent" / "x.py").unlink()
    assert "links" not in read(run_dir)


def test_the_read_names_the_run_s_checkpoints_for_train_resume_never(open_dir: Path):
    """train.yml refuses train_resume=never on a run with checkpoints before anything starts:
    the read lists the trainer's checkpoint names, nothing else in checkpoints/."""
    run_dir = open_dir / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    assert "checkpoints" not in read(run_dir)
    for name in ("step-000000012.pt", "step-000000004.pt", ".step-000000016.pt.tmp", "order.json"):
        (run_dir / "checkpoints" / name).write_bytes(b"x")
    files = read(run_dir)
    assert files["checkpoints"] == {"checkpoints": ["step-000000004.pt", "step-000000012.pt"]}
    assert view.snapshot(files, "r", HOSTS, "")["checkpoints"] == [
        "step-000000004.pt",
        "step-000000012.pt",
    ]


def test_the_read_takes_report_txt_and_notes_report_png(open_dir: Path):
    """The follow's last read carries the report: report.txt's text, and whether report.png is
    there (its path is shown, not its bytes)."""
    run_dir = open_dir / "run"
    run_dir.mkdir()
    assert "present" not in read(run_dir)
    (run_dir / "report.txt").write_text("rank  img/s\n0     55.2\n")
    (run_dir / "report.png").write_bytes(b"\x89PNG\r\n\x1a\n")
    files = read(run_dir)
    assert files == {"report.txt": {"text": "rank  img/s\n0     55.2\n"},
                     "present": {"present": ["report.png"]}}  # fmt: skip
    s = view.snapshot(files, "r", HOSTS, "")
    assert (s["report"], s["plot"]) == ("rank  img/s\n0     55.2\n", True)
    s = view.snapshot({}, "r", HOSTS, "")
    assert (s["report"], s["plot"]) == (None, False)


def test_a_report_that_is_a_link_is_named_and_not_followed(open_dir: Path):
    (open_dir / "theirs.txt").write_text("not the run's report\n")
    run_dir = open_dir / "run"
    run_dir.mkdir()
    (run_dir / "report.txt").symlink_to(open_dir / "theirs.txt")
    (run_dir / "report.png").symlink_to(open_dir / "theirs.txt")
    assert read(run_dir) == {"links": {"links": ["report.txt", "report.png"]}}


@pytest.mark.wallclock
def test_a_read_that_waits_answers_soon_after_progress_json_says_the_run_ended(open_dir: Path):
    """train.yml's follow sees the end within a tick of it, not up to a poll later: the read
    re-reads progress.json on the node (a torn one meanwhile is not an end), then prints every
    record as a read without wait does."""
    run_dir = open_dir / "run"
    run_dir.mkdir()
    (run_dir / "progress.json").write_text('{"status": "comp')  # torn while written
    ending = threading.Timer(0.5, write_atomic, (run_dir / "progress.json",
                                                 json.dumps(ended("completed"))))  # fmt: skip
    started = time.monotonic()
    ending.start()
    try:
        files = read(run_dir, wait=20)
    finally:
        ending.cancel()
    took = time.monotonic() - started
    assert files == {"progress.json": ended("completed")}
    assert 0.5 <= took < within(2.5), took


@pytest.mark.wallclock
def test_a_read_that_waits_on_a_run_that_goes_on_answers_after_the_wait(open_dir: Path):
    run_dir = open_dir / "run"
    run_dir.mkdir()
    (run_dir / "progress.json").write_text(json.dumps(progress(step=7)))
    started = time.monotonic()
    files = read(run_dir, wait=1.5)
    took = time.monotonic() - started
    assert files == {"progress.json": progress(step=7)}
    assert 1.5 <= took < within(3.0), took


def test_the_read_s_timeout_leaves_room_for_its_wait():
    """A long-poll is not a storage that does not answer: timeout(1) gets the wait on top."""
    assert view.read_command("/runs/r", 1, 1, 5).startswith(
        f"timeout -k 5 {view.READ_TIMEOUT + 5} python3 -c "
    )
    assert view.read_command("/runs/r", 1, 1).startswith(f"timeout -k 5 {view.READ_TIMEOUT} ")


@pytest.mark.wallclock
@pytest.mark.parametrize("wait", [0, 30])
def test_read_command_of_a_missing_run_dir_prints_nothing(open_dir: Path, wait: float):
    """At once, whatever the wait: no run to wait for."""
    cmd = view.read_command(str(open_dir / "absent"), NOBODY, NOBODY, wait)
    started = time.monotonic()
    proc = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (0, "")
    assert time.monotonic() - started < within(5)


@pytest.mark.skipif(os.getuid() != 0, reason="drops root's privileges, as on a node (CI is root)")
def test_a_run_dir_the_owner_cannot_open_is_an_error_not_an_absent_run(open_dir: Path):
    """status.yml then reads each host's own record (an absent run would say "not found")."""
    run_dir = open_dir / "run"
    run_dir.mkdir(mode=0o700)  # root's: nobody cannot open it
    cmd = view.read_command(str(run_dir), NOBODY, NOBODY)
    proc = subprocess.run(["/bin/sh", "-c", cmd], capture_output=True, text=True, check=False)
    assert (proc.returncode, proc.stdout) == (1, "")
    assert proc.stderr.strip() == "Permission denied"


@pytest.mark.skipif(os.getuid() != 0, reason="drops root's privileges, as on a node (CI is root)")
def test_read_follows_no_link_and_reads_as_the_owner_without_root_s_groups(open_dir: Path):
    secret = open_dir / "secret.json"  # root-only, as /etc/shadow
    secret.write_text('{"secret": 1}')
    secret.chmod(0o600)
    public = open_dir / "public.json"
    public.write_text('{"public": 1}')
    run_dir = open_dir / "run"
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "nodes" / "node1.exit").symlink_to(secret)  # planted by a container
    (run_dir / "summary.json").symlink_to(
        public
    )  # a link is never followed, even to a readable file
    os.mkfifo(run_dir / "nodes" / "node2.exit")  # would block a reader that opens it
    group_only = run_dir / "config.json"  # readable by root's group (gid 0), not by others
    group_only.write_text('{"attempt": "a1"}')
    group_only.chmod(0o640)
    (run_dir / "progress.json").write_text('{"step": 3}')
    assert read(run_dir) == {
        "progress.json": {"step": 3},
        "links": {"links": ["summary.json", "nodes/node1.exit"]},  # named, so refused
    }
    # read as root (uid and gid 0) config.json is there: the owner's read left it out
    assert read(run_dir, 0, 0)["config.json"] == {"attempt": "a1"}


def test_status_reads_through_become_on_a_node_reached_as_a_sudo_user(open_dir: Path):
    """The read needs root to drop to the owner: from a sudo login (inventory/sample's
    ubuntu) it must go through become, or it runs as the login user and fails."""
    run_dir = open_dir / "run"
    (run_dir / "nodes").mkdir(parents=True)
    (run_dir / "config.json").write_text('{"run_id": "r", "attempt": "a2"}')
    (run_dir / "progress.json").write_text(json.dumps(ended("completed")))
    (run_dir / "report.txt").write_text("the report\n")
    (run_dir / "report.png").write_bytes(b"png")
    for host in HOSTS:
        (run_dir / "nodes" / f"{host}.exit").write_text(json.dumps(exit_rec(host)))
    task = mock.MagicMock(async_val=0, check_mode=False)
    task.args = {"run_dir": str(run_dir), "run_id": "r", "hosts": HOSTS, "once": True,
                 "owner_uid": NOBODY, "owner_gid": NOBODY}  # fmt: skip
    action = follow.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None, None)
    with mock.patch.object(action, "_low_level_execute_command", side_effect=node_shell):
        result = action.run(task_vars={})
    assert result["outcome"] == "completed"
    assert result["status_lines"][0] == "run r: completed"
    assert (result["report"], result["plot"]) == ("the report\n", True)  # status.yml's report


# --- outcomes ------------------------------------------------------------------------------


def test_a_run_is_going_until_progress_json_says_it_ended():
    """Exit records alone do not end it: node rank 0's agent writes the status word once it
    knows every host's exit, after summary.json and report.txt."""
    s = snap(exits=[exit_rec(h) for h in HOSTS], prog=progress())
    assert s["outcome"] is None
    assert sorted(s["exits"]) == HOSTS


def test_progress_line_of_a_program_without_heartbeats_says_how_long_it_runs():
    p = {"step": 0, "program": "x.py", "elapsed_sec": 125.0,
         "hosts": {"node1": "running", "node2": "running", "node3": "exited"}}  # fmt: skip
    assert view.progress_line("r", p, HOSTS) == (
        "run r: running 2m05s (no progress reported), hosts running 2/3: node3 exited"
    )
    beating = {**p, "phase": "train", "step": 3}
    assert view.progress_line("r", beating, HOSTS).startswith("run r: step 3, loss ?")


@pytest.mark.parametrize(
    ("status", "expected"),
    [("completed", "completed"), ("stopped", "stopped"), ("failed", "failed"),
     ("unknown", None), ("running", None), (None, None)],
)  # fmt: skip
def test_outcome_is_progress_json_s_status_word(status, expected):
    assert snap(prog=ended(status))["outcome"] == expected


def test_records_of_an_earlier_attempt_do_not_count():
    s = snap(exits=[exit_rec(h, attempt="a1") for h in HOSTS], prog=ended("failed", attempt="a1"))
    assert (s["outcome"], s["exits"], s["progress"], s["line"]) == (None, {}, {}, "")


# --- lines ---------------------------------------------------------------------------------


def test_progress_line():
    assert view.progress_line("r", progress(), HOSTS) == (
        "run r: step 40/100 (40%), loss 6.1234, 55.2 img/s, ETA 1m05s, "
        "hosts running 3/3 (phase train)"
    )


def test_a_restarted_run_says_so_once_per_restart():
    hosts = ["a", "b", "c"]
    attempts = [{"restart": 0, "cause": None, "hosts": hosts},
                {"restart": 1, "cause": "run r failed: host x", "hosts": hosts},
                {"restart": 2, "cause": "run r failed: host c", "hosts": ["a", "b"]}]  # fmt: skip
    p = progress(restarts=2, attempts=attempts)
    assert view.progress_line("r", p, HOSTS).endswith("(phase train, restarts 2)")
    said = "run r: restarted {} ({}) from the newest checkpoint after: run r failed: host {}"
    first = said.format("in place", 1, "x")
    second = said.format("on 2 hosts (without c)", 2, "c")
    assert view.restart_lines("r", p, 0) == [first, second]
    assert view.restart_lines("r", p, 1) == [second]
    assert view.restart_lines("r", p, 2) == []


def test_follow_prints_a_progress_line_when_the_step_or_hosts_change_and_restarts_once():
    shown = view.Shown("r")
    first = shown.new_lines(snap(prog=progress(step=40)))
    assert first == [view.progress_line("r", progress(step=40), HOSTS)]
    assert shown.new_lines(snap(prog=progress(step=40))) == []  # nothing new
    moved = shown.new_lines(snap(prog=progress(step=41)))
    assert moved == [view.progress_line("r", progress(step=41), HOSTS)]
    attempts = [{"restart": 0, "cause": None, "hosts": HOSTS},
                {"restart": 1, "cause": "run r failed: host x", "hosts": HOSTS}]  # fmt: skip
    again = shown.new_lines(snap(prog=progress(step=41, restarts=1, attempts=attempts)))
    assert len(again) == 1  # the restart; the step did not move
    assert "restarted in place (1)" in again[0]
    assert shown.new_lines(snap(prog=progress(step=41, restarts=1, attempts=attempts))) == []


def test_follow_says_new_shares_once_they_are_known_and_then_the_next_restart():
    """A rebalance's start is 'rebalanced' until its ranks report their shares (restarts.py):
    the follow waits for the line that names them, and says it once."""
    shown = view.Shown("r")
    attempts = [{"restart": 0, "cause": None, "hosts": HOSTS},
                {"restart": 0, "cause": "rebalanced", "hosts": HOSTS}]  # fmt: skip
    assert shown.new_lines(snap(prog=progress(step=41, attempts=attempts))) == [
        view.progress_line("r", progress(step=41, attempts=attempts), HOSTS)
    ]
    attempts[1]["cause"] = "rebalanced: node3 4 -> 2 (0.31x)"
    said = shown.new_lines(snap(prog=progress(step=41, attempts=attempts)))
    assert said == ["run r: rebalanced: node3 4 -> 2 (0.31x) (1) from the newest checkpoint"]
    assert view.progress_line("r", progress(attempts=attempts), HOSTS).endswith(
        "(phase train, rebalanced: node3 4 -> 2 (0.31x))"
    )  # status.yml's line too
    attempts.append({"restart": 1, "cause": "run r failed: host x", "hosts": HOSTS})
    again = shown.new_lines(snap(prog=progress(step=41, restarts=1, attempts=attempts)))
    assert len(again) == 1
    assert "restarted in place (2)" in again[0]


def test_follow_prints_a_program_without_heartbeats_once_a_minute():
    shown = view.Shown("r")
    quiet = {"step": None, "phase": None, "program": True, "hosts": {}}
    assert len(shown.new_lines(snap(prog=progress(elapsed_sec=5, **quiet)))) == 1
    assert shown.new_lines(snap(prog=progress(elapsed_sec=50, **quiet))) == []
    assert len(shown.new_lines(snap(prog=progress(elapsed_sec=65, **quiet)))) == 1


def test_progress_line_names_hosts_not_running_and_unknown_values():
    p = {"step": 0, "hosts": {"node1": "running", "node2": "starting"}}
    assert view.progress_line("r", p, HOSTS) == (
        "run r: step 0, loss ?, ? img/s, ETA ?, hosts running 1/3: node2 starting, node3 unknown"
        " (phase ?)"
    )


@pytest.mark.parametrize(
    ("sec", "text"), [(None, "?"), (-1, "?"), (44.6, "45s"), (65, "1m05s"), (7380, "2h03m")]
)
def test_duration(sec, text):
    assert view.duration(sec) == text


@pytest.mark.parametrize(
    ("containers", "kw", "status"),
    [
        ({"node1": "running", "node2": "", "node3": ""}, {}, "running"),
        (dict.fromkeys(HOSTS, ""), {"prog": ended("completed")}, "completed"),
        (
            dict.fromkeys(HOSTS, ""),
            {"prog": ended("unknown"), "summary": {"status": "completed"}},
            "completed",
        ),
        (dict.fromkeys(HOSTS, ""), {"summary": {"status": "stopped"}}, "stopped"),
        (dict.fromkeys(HOSTS, ""), {}, "unknown"),
    ],
)
def test_run_status(containers, kw, status):
    assert view.run_status(snap(**kw), containers) == status


def test_run_status_of_a_run_never_launched_is_absent():
    assert view.run_status(view.snapshot({}, "r", HOSTS, ""), dict.fromkeys(HOSTS, "")) == "absent"


def test_status_lines():
    summary = {
        "status": "failed",
        "attempt": "a2",
        "steps": 7,
        "world_size": 3,
        "cause": "run r failed: host node2 rank 1: boom",
        "diagnosis": "rank 0 wait in all_reduce (engine.py:142); rank 1 (node2) in f (x.py:3)",
    }
    s = snap(
        exits=[exit_rec("node1", "failed"), exit_rec("node3", "failed")],
        summary=summary,
        prog=progress(step=7, hosts={"node1": "exited", "node2": "silent"}),
    )
    containers = {"node1": "", "node2": "", "node3": "exited"}
    assert view.status_lines("r", "failed", s, containers) == [
        "run r: failed",
        "node1: container absent; agent exit code 1 (failed)",
        "node2: container absent",
        "node3: container exited; agent exit code 1 (failed)",
        "run r: step 7/100 (7%), loss 6.1234, 55.2 img/s, ETA 1m05s, hosts running 0/3: "
        "node1 exited, node2 silent, node3 unknown (phase train)",
        "summary: status failed, steps 7, world size 3, img/s ?",
        "cause: run r failed: host node2 rank 1: boom",
        "where the ranks were: rank 0 wait in all_reduce (engine.py:142); rank 1 (node2) in f "
        "(x.py:3)",
    ]


def test_container_states_name_a_host_the_controller_could_not_reach():
    """state.yml's docker_container_info results as Ansible registers them: a container, none,
    a host it could not reach (ignore_unreachable), a host that looked nothing up."""
    looked = [
        {"exists": True, "container": {"State": {"Status": "running"}}},
        {"unreachable": True, "msg": "ssh: connect to host 10.213.97.12 port 22: timed out"},
        {"exists": False, "container": None},
    ]
    states = view.container_states(HOSTS, looked)
    assert states == {"node1": "running", "node2": "unreachable", "node3": ""}
    assert view.container_states(["a"], [{}]) == {"a": ""}
    completed = snap(prog=ended("completed"), summary={"status": "completed"})
    assert view.run_status(completed, states) == "running"  # node1's container still runs
    lines = view.status_lines("r", "completed", completed, {**states, "node1": "exited"})
    assert lines[1:4] == [
        "node1: container exited",
        "node2: unreachable",
        "node3: container absent",
    ]


# --- the action, fed with fake reads -------------------------------------------------------


def render(records: dict) -> str:
    """What reader.py prints for these records (TEXT's as their text)."""
    return "".join(
        f"{view.MARK} {name}\n{rec['text'] if name in view.TEXT else json.dumps(rec)}\n"
        for name, rec in records.items()
    )


class Sleeps(Clock):
    """The fake clock, noting each sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.slept: list[float] = []

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        super().sleep(seconds)


def run_action(
    reads: list, clock: Clock | None = None, took: float = 0.0, **args
) -> tuple[dict, list[str], list[str]]:
    """Run the action on a list of reads (dicts of records, an int: a failed command with that
    rc, an Event: a command that hangs until it is set, an exception: raised), each taking
    ``took`` s of the fake clock. Returns (result, lines displayed, commands run); the last
    read repeats."""
    task = mock.MagicMock(async_val=0, check_mode=False)
    task.args = {"run_dir": "/runs/r", "run_id": "r", "hosts": HOSTS, "poll_interval": 5,
                 "owner_uid": 2000, "owner_gid": 2000, **args}  # fmt: skip
    task.delegate_to = "node2"  # the trainer whose connection the task has
    action = follow.ActionModule(task, mock.MagicMock(), mock.MagicMock(), None, None, None)
    commands: list[str] = []

    clock = clock or Clock()

    def execute(cmd: str, sudoable: bool = True) -> dict:
        commands.append(cmd)
        clock.now += took  # the read's time on the node, not a sleep of the action
        read = reads[min(len(commands), len(reads)) - 1]
        if isinstance(read, threading.Event):  # a host gone dark: no answer until it is set
            read.wait()
            read = 255
        if isinstance(read, Exception):
            raise read
        if isinstance(read, int):
            return {"rc": read, "stdout": "", "stderr": "ssh: connection refused"}
        return {"rc": 0, "stdout": render(read), "stderr": ""}

    shown: list[str] = []
    with (
        mock.patch.object(action, "_low_level_execute_command", side_effect=execute),
        mock.patch.object(follow.display, "display", side_effect=shown.append),
        mock.patch.object(follow.time, "monotonic", clock.monotonic),
        mock.patch.object(follow.time, "sleep", clock.sleep),
    ):
        result = action.run(task_vars={})
    return result, shown, commands


def test_follow_prints_a_line_per_step_change_and_returns_the_outcome():
    done = [exit_rec(h) for h in HOSTS]
    reads = [
        files(),
        files(prog=progress(step=1)),
        files(prog=progress(step=1, time=2)),  # same step: no new line
        files(prog=progress(step=2)),
        files(exits=done, prog=ended("completed"), summary={"status": "completed"}),
    ]
    result, shown, commands = run_action(reads, attempt="a2")
    assert result["outcome"] == "completed"
    assert result["summary"] == {"status": "completed"}
    assert [line.split(",")[0] for line in shown] == [
        "run r: step 1/100 (1%)",
        "run r: step 2/100 (2%)",
    ]
    assert result["lines"] == shown
    assert len(commands) == 5
    assert all(c == view.read_command("/runs/r", 2000, 2000, 5) for c in commands)


def test_follow_s_reads_wait_for_the_end_and_it_sleeps_only_the_rest_of_the_interval():
    """Each read waits on the node (here 2 s of the fake clock); the poll stays one read per
    interval, and a failed read sleeps all of it: no read right after a failed one."""
    reads = [files(prog=progress(step=1)), 255, files(prog=progress(step=2)),
             files(prog=ended("completed"), summary={"status": "completed"})]  # fmt: skip
    clock = Sleeps()
    result, shown, commands = run_action(reads, clock=clock, took=2.0, attempt="a2")
    assert result["outcome"] == "completed"
    assert commands == [view.read_command("/runs/r", 2000, 2000, 5)] * 4
    assert clock.slept == [3.0, 5.0, 3.0]
    assert [line.split(",")[0] for line in shown] == ["run r: step 1/100 (1%)",
                                                      "run r: step 2/100 (2%)"]  # fmt: skip


def test_follow_s_wait_is_capped_well_below_ssh_s_patience():
    clock = Sleeps()
    reads = [files(prog=progress(step=1)), files(prog=ended("stopped"))]
    _, _, commands = run_action(reads, clock=clock, took=30.0, attempt="a2", poll_interval=120)
    assert commands == [view.read_command("/runs/r", 2000, 2000, follow.MAX_WAIT)] * 2
    assert clock.slept == [90.0]


def test_follow_returns_the_report_of_a_completed_run():
    """Taken by the read that saw the end: report.yml reads nothing more."""
    last = {**files(prog=ended("completed"), summary={"status": "completed"}),
            "report.txt": {"text": "rank  img/s\n0     55.2\n"},
            "present": {"present": ["report.png"]}}  # fmt: skip
    result, _, commands = run_action([files(prog=progress(step=1)), last], attempt="a2")
    assert (result["report"], result["plot"]) == ("rank  img/s\n0     55.2\n", True)
    assert len(commands) == 2


def test_follow_returns_once_progress_json_says_the_run_ended():
    """No exit record needed (the failed host's agent may have died with its container), and
    no wait for summary.json: the agents write it before the status word."""
    summary = {"status": "failed", "attempt": "a2", "cause": "run r failed: host node2 rank 1: x"}
    reads = [files(prog=progress(step=2)), files(prog=ended("failed"), summary=summary)]
    result, _, commands = run_action(reads, attempt="a2")
    assert (result["outcome"], result["summary"], len(commands)) == ("failed", summary, 2)


def test_follow_reports_agents_that_stopped_reporting():
    reads = [
        files(prog=progress(step=3)),
        files(exits=[exit_rec("node1", "failed")], prog=progress(step=3)),
    ]
    result, _, _ = run_action(reads, attempt="a2", stale_after=90)
    assert result["outcome"] == "lost"
    assert result["msg"] == (
        "run r: agents stopped reporting (progress.json and their logs unchanged for 95 s, no "
        "exit record from node2, node3); see status.yml -e run_id=r"
    )


def test_an_agent_s_log_line_counts_as_reporting_while_progress_json_stands_still():
    """Two hosts lost at once: the others wait for the next host's store, then for it at the
    restart, with nobody writing progress.json (failover.py); their log lines keep the follow
    on. Once the logs stand still too for stale_after, the agents stopped reporting."""
    growing = [{**files(prog=progress(step=3)), "logged": {"logged": [f"node3.log {n}"]}}
               for n in range(100, 112)]  # fmt: skip  # 12 reads 5 s apart: 55 s > 30
    done = {**files(prog=ended("completed"), summary={"status": "completed"})}
    result, _, _ = run_action([*growing, done], attempt="a2", stale_after=30)
    assert result["outcome"] == "completed"
    result, _, commands = run_action(growing, attempt="a2", stale_after=30)
    assert result["outcome"] == "lost"
    assert len(commands) == 12 + 6  # then 30 s of reads with the last size, and the end at 35
    assert result["msg"].startswith("run r: agents stopped reporting (progress.json and their "
                                    "logs unchanged for 35 s")  # fmt: skip


def test_follow_fails_when_the_run_dir_cannot_be_read_for_too_long():
    result, _, _ = run_action([files(prog=progress()), 255], attempt="a2", stale_after=30)
    assert result["failed"] is True
    assert result["msg"] == "cannot read /runs/r: ssh: connection refused"


def test_a_follow_with_a_trainer_after_it_hands_over_at_its_first_failed_read():
    """follow.yml's loop: node rank 0's host lost, the next trainer reads the same run directory;
    the restarts said so far go with the hand-over, and nothing is slept or retried here."""
    attempts = [{"restart": 0, "cause": None, "hosts": HOSTS},
                {"restart": 1, "cause": "run r failed: host x", "hosts": HOSTS}]  # fmt: skip
    reads = [files(prog=progress(step=3, restarts=1, attempts=attempts)), 255]
    clock = Sleeps()
    result, shown, commands = run_action(reads, clock=clock, attempt="a2", move_on=True)
    assert (result.get("failed"), result["unread"], result["shown"]) == (None, True, 1)
    assert result["msg"] == "ssh: connection refused"
    assert shown[-1] == (
        "run r: its records cannot be read through node2 (ssh: connection refused); reading "
        "them through the next trainer"
    )
    assert result["lines"] == shown[:-1]  # the restart and the progress line, said once
    assert (len(commands), clock.slept) == (2, [5.0])


@pytest.mark.wallclock
def test_a_read_through_a_host_gone_dark_hands_over_answer_s_after_its_wait(monkeypatch):
    """A host cut off the network: its read neither answers nor fails until SSH's keepalives
    give up (45 s); with a trainer after it, the follow hands over once the read has been silent
    ANSWER s after its wait, and leaves that read behind."""
    monkeypatch.setattr(follow, "ANSWER", 0.3)
    dark = threading.Event()
    threading.Timer(5.0, dark.set).start()  # were it waited for: SSH gives up, the read fails
    started = time.monotonic()
    try:
        reads = [files(prog=progress(step=3)), dark]
        result, shown, commands = run_action(reads, attempt="a2", move_on=True, poll_interval=0.1)
    finally:
        dark.set()
    took = time.monotonic() - started
    assert (result.get("failed"), result["unread"]) == (None, True)
    assert result["msg"] == "no answer within 0.4 s"
    assert shown[-1].startswith("run r: its records cannot be read through node2 (no answer")
    assert len(commands) == 2
    assert 0.4 <= took < within(2.0), took


@pytest.mark.wallclock
def test_the_last_trainer_s_read_is_waited_for_however_long_it_takes(monkeypatch):
    """No trainer after it: its read is not given up on (SSH's keepalives and the read's own
    timeout(1) bound it), and an answer later than ANSWER is taken."""
    monkeypatch.setattr(follow, "ANSWER", 0.05)
    late = threading.Event()
    threading.Timer(0.5, late.set).start()  # it fails late; the next read says the run ended
    reads = [late, files(prog=ended("completed"), summary={"status": "completed"})]
    started = time.monotonic()
    result, shown, commands = run_action(reads, attempt="a2", move_on=False, poll_interval=0.1)
    assert time.monotonic() - started >= 0.5  # not given up on after 0.15 s
    assert (result["outcome"], len(commands)) == ("completed", 2)
    assert not any("next trainer" in line for line in shown)


def test_an_error_of_a_read_with_a_trainer_after_it_is_the_task_s():
    """The read runs in a thread where a trainer comes after it: what it raises (not a lost
    connection, which hands over) still ends the task as Ansible's error."""
    with pytest.raises(AnsibleError, match="sudo: a password is required"):
        run_action([AnsibleError("sudo: a password is required")], attempt="a2", move_on=True)


def test_the_next_trainer_s_follow_does_not_say_a_restart_again():
    attempts = [{"restart": 0, "cause": None, "hosts": HOSTS},
                {"restart": 1, "cause": "run r failed: host x", "hosts": HOSTS},
                {"restart": 2, "cause": "run r failed: host y", "hosts": HOSTS}]  # fmt: skip
    reads = [files(prog=ended("completed", restarts=2, attempts=attempts), summary={})]
    result, shown, _ = run_action(reads, attempt="a2", shown=1)
    assert result["outcome"] == "completed"
    assert [line for line in shown if "restarted" in line] == [
        "run r: restarted in place (2) from the newest checkpoint after: run r failed: host y"
    ]


def test_the_last_trainer_s_follow_retries_a_failed_read():
    reads = [255, files(prog=ended("completed"), summary={"status": "completed"})]
    result, shown, commands = run_action(reads, attempt="a2", move_on=False)
    assert (result["outcome"], len(commands)) == ("completed", 2)
    assert not any("next trainer" in line for line in shown)


def test_a_read_that_timeout_ended_says_the_storage_may_be_gone():
    result, _, _ = run_action([124], once=True)
    assert result["failed"] is True
    assert result["msg"] == (
        f"cannot read /runs/r: no answer within {view.READ_TIMEOUT} s: is the shared storage gone?"
    )


def test_once_reads_one_time_and_takes_the_attempt_from_config_json():
    reads = [files(exits=[exit_rec("node1")], prog=progress(step=9))]
    containers = {"node1": "", "node2": "running", "node3": "running"}
    result, shown, commands = run_action(reads, once=True, containers=containers)
    assert (result["outcome"], result["attempt"], len(commands), shown) == ("running", "a2", 1, [])
    assert result["status_lines"][:4] == [
        "run r: running",
        "node1: container absent; agent exit code 0 (completed)",
        "node2: container running",
        "node3: container running",
    ]
    assert result["lines"] == [result["status_lines"][4]]
    assert commands == [view.read_command("/runs/r", 2000, 2000)]  # no wait: status.yml's read
    assert (result["report"], result["plot"]) == (None, False)


def test_once_fails_when_the_run_dir_cannot_be_read():
    result, _, _ = run_action([255], once=True)
    assert result["failed"] is True
