"""NaN and inf: refused as option values; a loss that becomes non-finite fails the run at the
step it happened, and no checkpoint with non-finite weights is ever written."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn
from trainer_helpers import TINY, read_json, run_trainer

from trainer import checkpoint as ckpt
from trainer.__main__ import main
from trainer.config import get_args_parser
from trainer.distributed import DistEnv
from trainer.metrics import Heartbeat, NonFiniteError

SYNTH = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "64", "--arch"]
SYNTH += ["resnet18", "--warmup-epochs", "0", "--seed", "3"]
FLOAT_FLAGS = sorted(
    a.option_strings[0] for a in get_args_parser()._actions if a.type is float and a.option_strings
)


def test_every_float_flag_is_covered() -> None:
    assert {"--lr", "--dist-timeout", "--momentum", "--warmup-epochs"} <= set(FLOAT_FLAGS)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
@pytest.mark.parametrize("flag", FLOAT_FLAGS)
def test_non_finite_float_flag_exit_2_one_line(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [*SYNTH, "--max-steps", "1", f"{flag}={value}", "--output-dir", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"trainer: error: {flag} must be a finite number (got {float(value)})\n"
    )
    assert not (tmp_path / "out" / "summary.json").exists()


class PoisonedLoss(nn.CrossEntropyLoss):
    """Cross entropy whose ``at``-th call (the step of that number) returns NaN."""

    at = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.calls = 0

    def forward(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        loss = super().forward(logits, target)
        return loss * math.nan if self.calls == self.at else loss


def poisoned_run(monkeypatch: pytest.MonkeyPatch, at: int, out: Path, extra: list[str]) -> int:
    monkeypatch.setattr(PoisonedLoss, "at", at)
    monkeypatch.setattr(nn, "CrossEntropyLoss", PoisonedLoss)
    return main([*SYNTH, "--max-steps", "12", *extra, "--output-dir", str(out)])


def assert_checkpoints_finite(out: Path) -> list[int]:
    steps = []
    for step, path in ckpt.list_checkpoints(out / "checkpoints"):
        model = torch.load(path, weights_only=True)["model"]
        assert all(t.isfinite().all() for t in model.values() if t.is_floating_point()), path
        steps.append(step)
    return steps


def assert_strict_json_rows(out: Path) -> list[int]:
    """metrics.jsonl as a strict parser reads it: no NaN or Infinity in any row."""

    def refuse(name: str) -> float:
        raise AssertionError(f"{name} in metrics.jsonl")

    rows = (out / "metrics.jsonl").read_text().splitlines()
    return [json.loads(r, parse_constant=refuse)["step"] for r in rows]


def test_nan_loss_fails_the_run_at_its_step_at_the_log_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Used to go on training NaN weights, checkpoint them and end "completed"."""
    extra = ["--log-every", "2", "--checkpoint-every", "2", "--keep-checkpoints", "5"]
    assert poisoned_run(monkeypatch, 5, tmp_path, extra) == 3  # EXIT_DIVERGED: not restarted
    s = read_json(tmp_path / "summary.json")
    assert (s["status"], s["error"], s["nonfinite_step"]) == (
        "failed", "loss became non-finite at step 5", 5,
    )  # fmt: skip
    assert s["last_checkpoint"] == "checkpoints/step-000000004.pt"
    assert assert_checkpoints_finite(tmp_path) == [4, 2]
    assert assert_strict_json_rows(tmp_path) == [2, 4]
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert "training failed: loss became non-finite at step 5" in log
    assert "Traceback" not in log


def test_nan_loss_between_log_intervals_writes_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Step 5's NaN made the weights NaN; the step-6 checkpoint comes before the next log
    interval (step 10): it is not written, and step 3's stays the newest."""
    extra = ["--log-every", "10", "--checkpoint-every", "3", "--keep-checkpoints", "5"]
    assert poisoned_run(monkeypatch, 5, tmp_path, extra) == 3
    s = read_json(tmp_path / "summary.json")
    assert (s["status"], s["error"]) == ("failed", "loss became non-finite at step 5")
    assert s["last_checkpoint"] == "checkpoints/step-000000003.pt"
    assert assert_checkpoints_finite(tmp_path) == [3]
    assert assert_strict_json_rows(tmp_path) == []


def test_non_finite_weights_are_never_saved(tmp_path: Path) -> None:
    """Whatever the loss said (e.g. the last step's update overflowed): no NaN checkpoint."""
    model = nn.Linear(2, 2)
    with torch.no_grad():
        model.weight[0, 0] = math.inf
    run = SimpleNamespace(
        heartbeat=Heartbeat(0, 0, "h"), env=DistEnv(), raw_model=model, step=7,
        cfg=SimpleNamespace(output_dir=str(tmp_path), keep_checkpoints=2),
    )  # fmt: skip
    with pytest.raises(NonFiniteError, match="parameters became non-finite by step 7") as info:
        ckpt.save_run(run, 0)  # type: ignore[arg-type]
    assert info.value.step == 7
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_2rank_diverging_run_fails_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    """A learning rate of 1e30 drives the weights to inf/NaN within a few steps."""
    args = [*SYNTH, "--lr", "1e30", "--max-steps", "40", "--log-every", "4"]
    args += ["--checkpoint-every", "1", "--keep-checkpoints", "40", "--output-dir", str(tmp_path)]
    proc = run_trainer(args, nproc=2)
    assert proc.returncode != 0
    s = read_json(tmp_path / "summary.json")
    assert s["status"] == "failed", s
    assert s["error"].startswith(("loss became non-finite at step", "parameters became non-f"))
    assert s["nonfinite_step"] < 40
    steps = assert_checkpoints_finite(tmp_path)
    assert steps, "the first steps' checkpoints were finite"
    assert max(steps) <= s["nonfinite_step"]
    assert s["last_checkpoint"] == f"checkpoints/step-{steps[0]:09d}.pt"
    for rank in (0, 1):
        log = (tmp_path / "logs" / f"rank-{rank}.log").read_text()
        assert f"training failed: {s['error']}" in log
