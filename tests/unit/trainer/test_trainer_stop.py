"""Stopping: agreed at log intervals (no collective per step), and in the middle of validation."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from time_bounds import within
from trainer_helpers import (
    TINY,
    read_json,
    read_metrics,
    run_trainer,
    trainer_cmd,
    trainer_env,
)

from trainer import distributed as dist_utils
from trainer import runner
from trainer.make_dataset import write_dataset
from trainer.metrics import HEARTBEAT_DIR_ENV, LOG, Heartbeat
from trainer.stop import StopFlag

SYNTH = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "64"]
SYNTH += ["--arch", "resnet18", "--warmup-epochs", "0", "--log-every", "5"]


@pytest.fixture
def collectives(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, str, int]]]:
    """The run's collectives outside DDP, in-process: (function, heartbeat phase, step)."""
    calls: list[tuple[str, str, int]] = []
    beats: list[Heartbeat] = []

    class Recorded(Heartbeat):
        def __init__(self, *args: object, **kwargs: object) -> None:
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]
            beats.append(self)

    def spy(name: str):
        real = getattr(dist_utils, name)

        def recorded(env: dist_utils.DistEnv, value: object) -> object:
            record = beats[-1].snapshot()
            calls.append((name, str(record["phase"]), int(record["step"])))  # type: ignore[call-overload]
            return real(env, value)

        return recorded

    monkeypatch.delenv(HEARTBEAT_DIR_ENV, raising=False)
    monkeypatch.setattr(runner, "Heartbeat", Recorded)
    for name in ("all_reduce_sum", "agree_max"):
        monkeypatch.setattr(dist_utils, name, spy(name))
    yield calls
    for handler in LOG.handlers:  # the run's handlers: its log file, this test's stdout
        handler.close()
    LOG.handlers.clear()


def test_training_steps_agree_on_stopping_once_per_log_interval(
    collectives: list[tuple[str, str, int]], tmp_path: Path
) -> None:
    code = runner.run([*SYNTH, "--max-steps", "10", "--output-dir", str(tmp_path)], StopFlag())
    assert code == 0
    training = [(name, step) for name, phase, step in collectives if phase == "train"]
    assert training == [("all_reduce_sum", 5), ("all_reduce_sum", 10)]
    validation = [c for c in collectives if c[1] == "validate"]
    assert len(validation) == 32 // 5 + 1  # 32 val batches: a stop check every 5, the accuracy


def test_a_signal_is_agreed_at_the_next_log_interval(
    collectives: list[tuple[str, str, int]], tmp_path: Path
) -> None:
    stop = StopFlag()
    stop.signum = signal.SIGTERM  # as if it arrived during the first step
    code = runner.run([*SYNTH, "--max-steps", "20", "--output-dir", str(tmp_path)], stop)
    assert (code, stop.agreed) == (143, signal.SIGTERM)
    s = read_json(tmp_path / "summary.json")
    assert (s["status"], s["steps"]) == ("stopped", 5)
    assert read_metrics(tmp_path)[-1]["step"] == 5
    assert (tmp_path / "checkpoints" / "step-000000005.pt").is_file()


def test_a_peers_signal_is_agreed_as_sigterm() -> None:
    stop = StopFlag()
    assert not stop.settle(0)
    assert stop.settle(signal.SIGINT)  # only a peer got one
    assert stop.agreed == signal.SIGTERM
    stop.signum = signal.SIGINT  # this rank's own, arriving later, changes nothing
    assert stop.settle(0)
    assert stop.agreed == signal.SIGTERM


@pytest.fixture(scope="module")
def long_val_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2 steps of training per epoch (2 ranks x batch 2), then 150 validation batches."""
    root = tmp_path_factory.mktemp("longval")
    write_dataset(root, classes=2, train_per_class=4, val_per_class=300, size=32)
    return root


def wait_for_phase(path: Path, phase: str, proc: subprocess.Popen, timeout: float = 180) -> dict:
    deadline = time.time() + within(timeout)
    while time.time() < deadline and proc.poll() is None:
        if path.exists() and (beat := read_json(path))["phase"] == phase:
            return beat
        time.sleep(0.02)
    raise AssertionError(f"{path} never reported phase {phase}")


@pytest.mark.slow
def test_sigterm_during_validation_checkpoints_at_once_and_resumes(
    long_val_folder: Path, tmp_path: Path
) -> None:
    out, beats = tmp_path / "out", tmp_path / "beats"
    args = [*TINY, "--data-dir", str(long_val_folder), "--epochs", "2", "--log-every", "5"]
    args += ["--warmup-epochs", "0", "--output-dir", str(out)]
    env = trainer_env(DDPFLEET_HEARTBEAT_DIR=str(beats), DDPFLEET_HEARTBEAT_INTERVAL="0.05")
    proc = subprocess.Popen(
        trainer_cmd(args, nproc=2), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    beat = wait_for_phase(beats / "rank-1.json", "validate", proc)
    os.kill(beat["pid"], signal.SIGTERM)  # one rank only: its peer stops on the agreement
    _, err = proc.communicate(timeout=within(120))

    # $DDPFLEET_HEARTBEAT_DIR says an agent supervises: the trainer hands over its part
    s = read_json(out / "summary.trainer.json")
    assert (s["status"], s["steps"], s["final_accuracy"]) == ("stopped", 2, None), err[-3000:]
    assert not (out / "summary.json").exists()  # the agent's to write
    assert "epoch 0 validation abandoned" in (out / "logs" / "rank-0.log").read_text()
    assert torch.load(out / "checkpoints" / "step-000000002.pt", weights_only=True)["step"] == 2
    # torchrun's report of its ranks: each ended on SIGTERM. 143 is the trainer's own exit;
    # -15 is a rank torchrun signalled again (after its peer's exit) while the interpreter was
    # already finalising, where Python has put the default handler back. Either way after the
    # "done" heartbeat checked below, so the stop itself ran to the end on both ranks.
    exits = dict(re.findall(r"rank\s*:\s*(\d+) .*\n\s*exitcode\s*:\s*(-?\d+)", err))
    assert exits.keys() == {"0", "1"}, err[-3000:]
    assert set(exits.values()) <= {"143", "-15"}, err[-3000:]
    for rank in (0, 1):
        final = read_json(beats / f"rank-{rank}.json")
        assert (final["phase"], final["step"], final["total_steps"]) == ("done", 2, 4)
    assert not (out / "heartbeat").exists()  # the agent's directory replaces it

    proc = run_trainer(args, nproc=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    s = read_json(out / "summary.json")
    assert (s["status"], s["resumed_from_step"], s["steps"]) == ("completed", 2, 4)
    assert s["final_accuracy"] is not None
