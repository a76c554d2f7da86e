"""summary.json of a real trainer run: under its agent, written once, whole, by the agent from
the part the trainer hands over (summary.trainer.json); without an agent, by the trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from time_bounds import within
from trainer_helpers import TINY, free_port, read_json, run_trainer, trainer_env

from ddpfleet_agent.summary import SUMMARY, TRAINER_PART

ROOT = Path(__file__).resolve().parents[3]
SYNTH = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "16", "--arch"]
SYNTH += ["resnet18", "--warmup-epochs", "0", "--seed", "3", "--max-steps", "3"]


def watch(proc: subprocess.Popen, path: Path, timeout: float) -> list[str]:
    """Each distinct text of ``path``, read about every millisecond until ``proc`` ends."""
    seen: list[str] = []
    deadline = time.monotonic() + within(timeout)
    while time.monotonic() < deadline:
        ended = proc.poll() is not None
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = None
        if text is not None and (not seen or seen[-1] != text):
            seen.append(text)
        if ended:
            return seen
        time.sleep(0.001)
    proc.kill()
    raise AssertionError(f"the agent still ran after {timeout} s")


@pytest.mark.slow
def test_under_its_agent_the_summary_appears_once_with_the_trainer_s_part_and_attempts(
    tmp_path: Path,
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    key = tmp_path / "agent.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    agent = [sys.executable, "-m", "ddpfleet_agent", "--run-dir", str(run), "--run-id", "s1",
             "--host", "h0", "--node-rank", "0", "--hosts", "h0", "--attempt", "a1",
             "--store", f"127.0.0.1:{free_port()}", "--key-file", str(key)]  # fmt: skip
    trainer = [sys.executable, "-m", "trainer", *SYNTH, "--output-dir", str(run)]
    env = trainer_env(PYTHONPATH=str(ROOT), TMPDIR=str(tmp_path))
    proc = subprocess.Popen([*agent, "--", *trainer], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip
    seen = watch(proc, run / SUMMARY, 240)
    output = proc.communicate()[0]
    assert proc.returncode == 0, output[-3000:]
    assert len(seen) == 1, seen  # never the trainer's part alone, never rewritten
    summary = json.loads(seen[0])
    assert (summary["status"], summary["steps"], summary["world_size"]) == ("completed", 3, 1)
    assert (summary["attempt"], summary["restarts"]) == ("a1", 0)
    assert [a["attempt"] for a in summary["attempts"]] == ["a1"]
    assert not (run / TRAINER_PART).exists()  # the agent took it
    assert "status completed, steps 3" in (run / "report.txt").read_text()


@pytest.mark.slow
def test_without_an_agent_the_trainer_writes_summary_json_itself(tmp_path: Path) -> None:
    proc = run_trainer([*SYNTH, "--output-dir", str(tmp_path)])  # no $DDPFLEET_HEARTBEAT_DIR
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_json(tmp_path / SUMMARY)
    assert (s["status"], s["steps"]) == ("completed", 3)
    assert "attempts" not in s  # no agent, no attempts
    assert not (tmp_path / TRAINER_PART).exists()
