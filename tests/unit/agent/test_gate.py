"""The way back of a host left out as too slow (gate.py): the compute check's command from the
run's, and the gate's rule over real check processes (a stand-in program prints the figures
doctor's check prints, from a file the test sets)."""

from __future__ import annotations

import json
import sys
import time

import pytest

from ddpfleet_agent import gate
from ddpfleet_agent.gate import Gate, check_command, figure


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


@pytest.fixture
def checks(tmp_path, monkeypatch):
    """A Gate over a stand-in check that prints {"images_per_sec": <the file's number>} (or
    sleeps, for 'sleep'), and the lines it says."""
    monkeypatch.setattr(gate, "EVERY", 0.0)
    value = tmp_path / "figure"
    program = (
        "import json, sys, time; v = open(sys.argv[1]).read().strip()\n"
        "if v == 'sleep': time.sleep(60)\n"
        "if v == 'fail': sys.exit('doctor compute: the model failed')\n"
        "print(json.dumps({'images_per_sec': float(v)}))"
    )
    said: list[str] = []
    made = Gate([sys.executable, "-c", program, str(value)], said.append)
    yield made, value, said
    made.close()


def run_one(made: Gate, value, text: str) -> bool:
    """Set the next check's figure and poll the gate until that check has been read."""
    value.write_text(text)
    made.passed(time.time())  # starts it
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
