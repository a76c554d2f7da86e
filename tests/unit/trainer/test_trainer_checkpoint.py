from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.checkpoint import (
    CheckpointError,
    archive_run,
    find_latest,
    list_checkpoints,
    load_checkpoint,
    put_first,
    save_checkpoint,
)


def state(step: int) -> dict:
    return {
        "model": {"w": torch.full((4,), float(step))}, "optimizer": {}, "scheduler": {},
        "scaler": {}, "step": step, "epoch": 0, "rng": [], "args": {"seed": 0},
    }  # fmt: skip


def test_keeps_only_the_newest(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, state(step), keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 2]
    assert load_checkpoint(tmp_path / "step-000000003.pt")["step"] == 3


KILLED_SAVE = """
import os, signal, sys, torch
from pathlib import Path
from trainer import checkpoint
def dying_save(obj, f):
    f.write(b"PK" + b"x" * 4096)  # part of a file, then a hard kill mid-save
    f.flush()
    os.kill(os.getpid(), signal.SIGKILL)
checkpoint.torch.save = dying_save
st = {"model": {}, "optimizer": {}, "scheduler": {}, "scaler": {}, "step": 2, "epoch": 0,
      "rng": [], "args": {}}
checkpoint.save_checkpoint(Path(sys.argv[1]), st, keep=2)
"""


def test_killed_during_save_leaves_previous_checkpoint_loadable(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, state(1), keep=2)
    proc = subprocess.run([sys.executable, "-c", KILLED_SAVE, str(tmp_path)], check=False)
    assert proc.returncode == -signal.SIGKILL
    assert list(tmp_path.glob(".step-000000002.pt.tmp-*"))  # the torn temp file is there
    path, loaded = find_latest(tmp_path)
    assert path.name == "step-000000001.pt"
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 1.0))
    save_checkpoint(tmp_path, state(3), keep=2)  # the next save clears the leftover
    assert not list(tmp_path.glob(".step-*"))


def test_damaged_newest_is_skipped_and_named(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, state(1), keep=3)
    save_checkpoint(tmp_path, state(2), keep=3)
    (tmp_path / "step-000000002.pt").write_bytes(b"garbage")
    skipped: list[str] = []
    path, _ = find_latest(tmp_path, skipped)
    assert path.name == "step-000000001.pt"
    assert len(skipped) == 1
    assert skipped[0].startswith(f"{tmp_path / 'step-000000002.pt'}: not a readable checkpoint")


def test_only_damaged_checkpoints_raise_not_start_over(tmp_path: Path) -> None:
    for step in (1, 2):
        (tmp_path / f"step-00000000{step}.pt").write_bytes(b"garbage")
    with pytest.raises(CheckpointError, match=r"no readable checkpoint in .*and 1 older one"):
        find_latest(tmp_path)
    assert find_latest(tmp_path / "none") is None  # no checkpoints at all: a fresh start


def test_pruning_keeps_the_newest_written_not_the_highest_steps(tmp_path: Path) -> None:
    """An older run's step-8 and step-9 must not push out a new run's step-1 and step-2."""
    for step in (8, 9):
        save_checkpoint(tmp_path, state(step), keep=2)
    save_checkpoint(tmp_path, state(1), keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 9]
    save_checkpoint(tmp_path, state(2), keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 1]
    assert sorted(p.name for p in tmp_path.glob("step-*")) == [
        "step-000000001.pt", "step-000000002.pt",
    ]  # fmt: skip
    assert find_latest(tmp_path)[0].name == "step-000000002.pt"


def test_a_resumed_older_checkpoint_becomes_the_newest(tmp_path: Path) -> None:
    """Resumed from step 4 while step 8 exists: the new step 5 and step 4 are kept, 8 goes."""
    for step in (4, 8):
        save_checkpoint(tmp_path, state(step), keep=3)
    put_first(tmp_path / "step-000000004.pt")
    assert [s for s, _ in list_checkpoints(tmp_path)] == [4, 8]
    save_checkpoint(tmp_path, state(5), keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [5, 4]
    assert not (tmp_path / "step-000000008.pt").exists()


def test_unlisted_checkpoints_are_older_than_listed_ones_highest_step_first(
    tmp_path: Path,
) -> None:
    for step in (3, 7):
        torch.save(state(step), tmp_path / f"step-00000000{step}.pt")  # copied in by hand
    assert [s for s, _ in list_checkpoints(tmp_path)] == [7, 3]
    save_checkpoint(tmp_path, state(5), keep=2)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [5, 7]
    (tmp_path / "order.json").write_text("{not json")  # a damaged order: by step again
    assert [s for s, _ in list_checkpoints(tmp_path)] == [7, 5]


def test_archive_moves_the_old_run_aside(tmp_path: Path) -> None:
    ckpts = tmp_path / "checkpoints"
    save_checkpoint(ckpts, state(9), keep=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 9}\n')
    (tmp_path / "summary.json").write_text('{"status": "completed"}\n')
    (tmp_path / "summary.trainer.json").write_text('{"status": "completed"}\n')  # no agent took it
    (tmp_path / "logs").mkdir()
    target = archive_run(tmp_path)
    assert target is not None
    assert target.parent == tmp_path / "archive"
    assert sorted(p.name for p in (target / "checkpoints").iterdir()) == [
        "order.json", "step-000000009.pt",
    ]  # fmt: skip
    assert (target / "metrics.jsonl").read_text() == '{"step": 9}\n'
    assert (target / "summary.json").is_file()
    assert (target / "summary.trainer.json").is_file()
    assert list_checkpoints(ckpts) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["archive", "checkpoints", "logs"]
    assert archive_run(tmp_path) is None  # nothing left to move


@pytest.mark.parametrize("content", [b"", b"not a zip", None])
def test_unusable_file_raises_checkpoint_error(tmp_path: Path, content: bytes | None) -> None:
    path = tmp_path / "c.pt"
    if content is None:
        torch.save({"model": {}}, path)  # a real torch file, but not ours
    else:
        path.write_bytes(content)
    with pytest.raises(CheckpointError):
        load_checkpoint(path)


def test_no_temp_file_remains_after_a_save(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, state(5), keep=1)
    assert sorted(os.listdir(tmp_path)) == ["order.json", "step-000000005.pt"]
