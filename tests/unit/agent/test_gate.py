"""The way back of a host left out as too slow (gate.py): the compute check's command from the
run's, and the gate's rule over real check processes (a stand-in program prints the figures
doctor's check prints, from a file the test sets)."""

from __future__ import annotations

import json
import sys
import tempfile
import time

import pytest

from ddpfleet_agent import failover, gate, stragglers
from ddpfleet_agent.cli import parse_args
from ddpfleet_agent.gate import Gate, check_command, figure
from ddpfleet_agent.machine import Standing
from ddpfleet_agent.supervise import Agent


def test_the_check_measures_the_run_s_model_as_the_trainer_s_command_line_gives_it():
    command = ["python", "-m", "ddpfleet_agent", "--run-dir=/r", "--", "torchrun", "--nnodes=3",
               "-m", "trainer", "--amp", "off", "--arch", "resnet18", "--batch-size", "16",
               "--image-size", "64", "--no-channels-last", "--synthetic"]  # fmt: skip
    assert check_command(command) == [
        sys.executable, "-m", "ddpfleet_doctor", "compute", "--seconds=4", "--warmup=2",
        "--amp=off", "--arch=resnet18", "--image-size=64", "--no-channels-last"]  # fmt: skip
    assert check_command(["torchrun", "-m", "trainer", "--arch"])[-1] == "--warmup=2"


def test_a_check_s_figure_or_why_it_has_none():
    line = json.dumps({"images_per_sec": 12.5, "device": "cpu"})
    assert figure(0, f"a warning\n{line}\n", "") == 12.5
    assert figure(1, "", "torch warning\ndoctor compute: no module named torch\n") == (
        "doctor compute: no module named torch"
    )
    assert figure(0, "not json\n", "") == "exit code 0"
    assert figure(-9, "", "") == "exit code -9"


CHECK = (
    "import json, sys, time; v = open(sys.argv[1]).read().strip()\n"
    "if v == 'sleep': time.sleep(60)\n"
    "if v == 'fail': sys.exit('doctor compute: the model failed')\n"
    "print(json.dumps({'images_per_sec': float(v)}))"
)


@pytest.fixture
def checks(tmp_path, monkeypatch):
    """A Gate over a stand-in check that prints {"images_per_sec": <the file's number>} (or
    sleeps, for 'sleep'), and the lines it says."""
    monkeypatch.setattr(gate, "EVERY", 0.0)
    value = tmp_path / "figure"
    said: list[str] = []
    made = Gate([sys.executable, "-c", CHECK, str(value)], said.append)
    yield made, value, said
    made.close()


@pytest.fixture
def on_par(checks):
    """The same, held also to the median host's pace in the run: 150 img/s (BACK: a third)."""
    made, value, said = checks
    made.par = 150.0
    return made, value, said


def run_one(made: Gate, value, text: str) -> bool:
    """Set the next check's figure and poll the gate until that check has been read."""
    value.write_text(text)
    opened = made.passed(time.time())  # starts it
    deadline = time.time() + 30
    while made.proc is not None and time.time() < deadline:
        time.sleep(0.02)
        opened = made.passed(time.time())
    return opened


def test_the_host_asks_once_a_check_is_twice_its_figure_as_it_was_left_out(checks):
    made, value, said = checks
    assert not run_one(made, value, "10")
    assert not run_one(made, value, "19.5")
    assert run_one(made, value, "20")
    assert said == [
        "doctor's compute check: 10 img/s as it was left out; it asks to come back at 20 img/s",
        "doctor's compute check: 19.5 img/s, 20 asked: still too slow",
        "doctor's compute check: 20 img/s, 20 asked: it asks to come back",
    ]
    assert made.passed(time.time())  # it stays open: no check runs again
    assert made.proc is None


def test_a_check_that_fails_lets_the_host_ask_as_any_host_left_out(checks):
    made, value, said = checks
    assert run_one(made, value, "fail")
    assert said == [
        "doctor's compute check failed (doctor compute: the model failed): it asks to come back"
    ]


def test_a_check_that_does_not_finish_is_still_too_slow(checks, monkeypatch):
    """The first did not finish: any later check that does is fast enough."""
    made, value, said = checks
    monkeypatch.setattr(gate, "TIMEOUT", 0.3)
    assert not run_one(made, value, "sleep")
    assert said == ["doctor's compute check did not finish in 0s: still too slow"]
    assert made.first == 0.0
    assert run_one(made, value, "3")


def test_closing_ends_a_check_still_running(checks):
    made, value, _ = checks
    value.write_text("sleep")
    made.passed(time.time())
    proc = made.proc
    assert proc is not None
    assert proc.poll() is None
    made.close()
    assert proc.poll() is not None
    assert not made.files.exists()


def test_a_host_whose_slowdown_ended_before_its_first_check_asks_at_once(on_par):
    made, value, said = on_par
    assert run_one(made, value, "60")
    assert said == [
        "doctor's compute check: 60 img/s as it was left out, 50 asked (a third of the median "
        "host's pace in the run): it asks to come back"
    ]
    assert made.on_par  # its agent holds it to its own figure for an hour (failover.py)


def test_a_host_held_to_its_own_figure_is_held_to_par_again_from_par_from(on_par):
    """Passed on par alone within the hour before (failover.py): its own figure only, until
    par_from."""
    made, value, said = on_par
    made.par_from = time.time() + 3600
    assert not run_one(made, value, "60")
    assert not run_one(made, value, "119")
    made.par_from = time.time()
    assert run_one(made, value, "60")
    assert said == [
        "doctor's compute check: 60 img/s as it was left out; it asks to come back at 120 img/s",
        "doctor's compute check: 119 img/s, 120 asked: still too slow",
        "doctor's compute check: 60 img/s, 50 asked: it asks to come back",
    ]
    assert made.on_par


@pytest.mark.parametrize(
    ("first", "asked", "on_par_then"), [("20", "40", False), ("30", "50", True)]
)
def test_a_host_still_slow_asks_at_double_its_figure_or_a_third_of_the_median_host_s_pace(
    on_par, first, asked, on_par_then
):
    """First at 20 img/s: doubling it (40) is the lower bar; at 30, a third of par (50) is."""
    made, value, said = on_par
    assert not run_one(made, value, first)
    assert said[0].endswith(f"as it was left out; it asks to come back at {asked} img/s")
    assert not run_one(made, value, str(float(asked) - 0.5))
    assert run_one(made, value, asked)
    assert said[-1] == f"doctor's compute check: {asked} img/s, {asked} asked: it asks to come back"
    assert made.on_par is on_par_then


def test_a_host_that_passed_on_par_is_held_to_its_own_figure_for_an_hour(tmp_path, monkeypatch):
    """h2's agent left out three times (failover.Heal.rejoined): the first time its first check
    is as fast as a third of the median host's pace and it asks at once; left out again, a check
    that passes on par alone may say nothing of its ranks' pace (a loader or a disk slows them,
    not the check), so it is held to twice its own first figure; left out an hour after it came
    back on par, par counts again."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    agent = Agent(parse_args([
        "--run-dir", str(tmp_path), "--run-id", "t1", "--hosts", "h0,h1,h2", "--host", "h2",
        "--node-rank", "2", "--store", "127.0.0.1:1", "--attempt", "a1", "--key-file", "k",
        "--min-hosts", "2", "--restarts", "1", "--", "true"]))  # fmt: skip
    value, asked, said = tmp_path / "figure", [], []
    value.write_text("60")
    monkeypatch.setattr(
        failover, "check_command", lambda _: [sys.executable, "-c", CHECK, str(value)]
    )
    monkeypatch.setattr(failover, "ASK_EVERY", 0.01)
    monkeypatch.setattr(gate, "EVERY", 0.0)
    peers, heal = agent.peers, agent.heal
    monkeypatch.setattr(peers, "reconnect", lambda: True)
    monkeypatch.setattr(peers, "run_over", lambda: False)
    monkeypatch.setattr(peers, "ask_to_join", lambda: asked.append(1))
    monkeypatch.setattr(peers, "welcomed", lambda: {"generation": len(asked)} if asked else None)
    monkeypatch.setattr(heal, "_back", lambda said, standing: (True, standing))
    heal.say, heal.stopped = said.append, lambda: len(said) > 4
    out = Standing(failure={"reason": "h2 left out", "leave_out": [2], "pace": 0.02})

    assert heal.rejoined(out)[0]  # par: 50 img/s for its one rank, a third asked
    assert said[1].endswith("60 img/s as it was left out, 16.67 asked (a third of the median "
                            "host's pace in the run): it asks to come back")  # fmt: skip
    came_back = heal.on_par_at
    assert time.time() - came_back < 60

    asked.clear()
    assert not heal.rejoined(out)[0]  # stopped after its second check: still too slow
    assert said[3] == (
        "doctor's compute check: 60 img/s as it was left out; it asks to come back at 120 img/s"
    )
    assert said[4] == "doctor's compute check: 60 img/s, 120 asked: still too slow"
    assert asked == []
    assert heal.on_par_at == came_back

    heal.on_par_at -= stragglers.PAR_AGAIN  # it came back on par an hour ago
    said.clear()
    heal.stopped = lambda: len(said) > 2
    assert heal.rejoined(out)[0]
    assert said[1].endswith("60 img/s as it was left out, 16.67 asked (a third of the median "
                            "host's pace in the run): it asks to come back")  # fmt: skip
