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
    find_latest,
    list_checkpoints,
    load_checkpoint,
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


def test_damaged_newest_is_skipped(tmp_path: Path) -> None:
    save_checkpoint(tmp_path, state(1), keep=3)
    (tmp_path / "step-000000002.pt").write_bytes(b"garbage")
    path, _ = find_latest(tmp_path)
    assert path.name == "step-000000001.pt"


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
    assert sorted(os.listdir(tmp_path)) == ["step-000000005.pt"]
