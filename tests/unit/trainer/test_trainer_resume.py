"""Which checkpoint a run starts from: rank 0 chooses for every rank, an unreadable newest one
is skipped and named, only unreadable ones refuse to start (nothing touched), ``--resume
never`` does not start over a run with checkpoints, ``--resume archive`` moves it aside, and
the newest written checkpoints survive pruning whatever their step numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from trainer_helpers import TINY, read_json, read_metrics, run_trainer

from trainer import distributed as dist_utils
from trainer import resume
from trainer.__main__ import main
from trainer.checkpoint import list_checkpoints, save_checkpoint
from trainer.config import BadInputError, parse_config

SYNTH = [*TINY, "--synthetic", "--num-classes", "4", "--synthetic-size", "16", "--arch"]
SYNTH += ["resnet18", "--warmup-epochs", "0", "--seed", "3"]


def state(step: int) -> dict:
    return {
        "model": {}, "optimizer": {}, "scheduler": {}, "scaler": {}, "step": step, "epoch": 0,
        "rng": [], "args": {},
    }  # fmt: skip


def snapshot(out: Path) -> dict[str, bytes]:
    """Every file under ``out`` with its bytes."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}


def used_run(out: Path, steps: tuple[int, ...]) -> None:
    """A run directory that holds damaged checkpoints of ``steps`` and its metrics."""
    (out / "checkpoints").mkdir(parents=True)
    for step in steps:
        (out / "checkpoints" / f"step-{step:09d}.pt").write_bytes(b"torn by a crash")
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.5}\n')


def test_only_unreadable_checkpoints_exit_2_and_touch_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Used to start over at step 0 and empty metrics.jsonl."""
    used_run(tmp_path, (2, 4))
    before = snapshot(tmp_path)
    assert main([*SYNTH, "--max-steps", "2", "--output-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"trainer: error: --resume auto: no readable checkpoint in {tmp_path / 'checkpoints'}: "
        f"{tmp_path / 'checkpoints' / 'step-000000004.pt'}: not a readable checkpoint"
    )
    assert "and 1 older one(s); fix or remove them, or start over with --resume archive" in err
    assert err.count("\n") == 1
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_2rank_only_unreadable_checkpoints_both_ranks_refuse(tmp_path: Path) -> None:
    used_run(tmp_path, (4,))
    before = snapshot(tmp_path)
    proc = run_trainer([*SYNTH, "--max-steps", "2", "--output-dir", str(tmp_path)], nproc=2)
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("trainer: error:")]
    assert len(lines) == 1, proc.stderr[-3000:]  # local rank 0 speaks for the host
    assert lines[0].startswith("trainer: error: --resume auto: no readable checkpoint in")
    assert "exitcode  : 2" in proc.stderr  # torchrun's report: no rank went on to train
    assert snapshot(tmp_path) == before


def test_resume_never_on_a_run_with_checkpoints_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Used to start over and then prune the new checkpoints away (lower step numbers)."""
    save_checkpoint(tmp_path / "checkpoints", state(6), keep=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 6, "loss": 0.5}\n')
    before = snapshot(tmp_path)
    argv = [*SYNTH, "--max-steps", "2", "--resume", "never", "--output-dir", str(tmp_path)]
    assert main(argv) == 2
    assert capsys.readouterr().err == (
        f"trainer: error: --resume never: {tmp_path / 'checkpoints'} has 1 checkpoint(s) "
        "(newest step-000000006.pt); continue with --resume auto, or start over with "
        f"--resume archive (moves them to {tmp_path / 'archive'})\n"
    )
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_resume_archive_moves_the_old_run_aside_and_starts_over(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "checkpoints", state(6), keep=2)
    (tmp_path / "metrics.jsonl").write_text('{"step": 6, "loss": 0.5}\n')
    (tmp_path / "summary.json").write_text('{"status": "completed", "steps": 6}\n')
    args = [*SYNTH, "--max-steps", "3", "--checkpoint-every", "1", "--resume", "archive"]
    proc = run_trainer([*args, "--output-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    (archived,) = (tmp_path / "archive").iterdir()
    assert (archived / "checkpoints" / "step-000000006.pt").is_file()
    assert (archived / "metrics.jsonl").read_text() == '{"step": 6, "loss": 0.5}\n'
    assert read_json(archived / "summary.json")["steps"] == 6
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [3, 2]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]
    s = read_json(tmp_path / "summary.json")
    assert (s["status"], s["steps"], s["resumed_from_step"]) == ("completed", 3, None)
    assert f"moved the previous checkpoints, metrics and summary to {archived}" in proc.stdout


def test_archive_is_a_resume_choice_not_a_file() -> None:
    assert parse_config(["--synthetic", "--resume", "archive"]).resume == "archive"


@pytest.mark.slow
def test_resumed_older_checkpoint_keeps_its_new_checkpoints(tmp_path: Path) -> None:
    """Resumed from step 2 while step 6 exists: the new steps 3 and 4 are the newest, kept
    over the higher-numbered step 6, and the next --resume auto continues from step 4."""
    args = [*SYNTH, "--checkpoint-every", "2", "--keep-checkpoints", "3"]
    first = run_trainer([*args, "--max-steps", "6", "--output-dir", str(tmp_path)])
    assert first.returncode == 0, first.stderr[-2000:]
    older = tmp_path / "checkpoints" / "step-000000002.pt"
    again = [*SYNTH, "--checkpoint-every", "1", "--keep-checkpoints", "2", "--max-steps", "4"]
    proc = run_trainer([*again, "--resume", str(older), "--output-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [4, 3]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]
    proc = run_trainer([*again, "--max-steps", "5", "--output-dir", str(tmp_path)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert read_json(tmp_path / "summary.json")["resumed_from_step"] == 4


@pytest.mark.slow
def test_2rank_unreadable_newest_falls_back_and_is_named(tmp_path: Path) -> None:
    args = [*SYNTH, "--checkpoint-every", "2", "--keep-checkpoints", "3"]
    first = run_trainer([*args, "--max-steps", "4", "--output-dir", str(tmp_path)], nproc=2)
    assert first.returncode == 0, first.stderr[-2000:]
    newest = tmp_path / "checkpoints" / "step-000000004.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # torn
    proc = run_trainer([*args, "--max-steps", "6", "--output-dir", str(tmp_path)], nproc=2)
    assert proc.returncode == 0, proc.stderr[-2000:]
    s = read_json(tmp_path / "summary.json")
    assert (s["status"], s["steps"], s["resumed_from_step"]) == ("completed", 6, 2)
    assert len(set(s["param_sha256_per_rank"])) == 1
    assert len(s["skipped_checkpoints"]) == 1
    assert s["skipped_checkpoints"][0].startswith(f"{newest}: not a readable checkpoint")
    log = (tmp_path / "logs" / "rank-0.log").read_text()
    assert f"skipped an unreadable checkpoint: {newest}: not a readable checkpoint" in log
    assert f"resuming from {tmp_path / 'checkpoints' / 'step-000000002.pt'}" in log
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4, 5, 6]
    # the resumed step-2 went first, and the new step-4 replaced the torn one
    assert [s for s, _ in list_checkpoints(tmp_path / "checkpoints")] == [6, 4, 2]
    torch.load(tmp_path / "checkpoints" / "step-000000004.pt", weights_only=True)


def test_every_rank_loads_the_checkpoint_rank_0_chose(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 1 sees a newer checkpoint than rank 0 did (e.g. storage caching): it loads rank
    0's choice anyway. The gather stands in for the process group."""
    ckpts = tmp_path / "checkpoints"
    save_checkpoint(ckpts, state(2), keep=5)
    chosen = {"path": str(ckpts / "step-000000002.pt"), "skipped": [], "error": None}
    save_checkpoint(ckpts, state(4), keep=5)  # rank 1's own listing would take this one
    calls: list[object] = []

    def gather(env: dist_utils.DistEnv, obj: object) -> list[object]:
        calls.append(obj)
        return [chosen, obj] if len(calls) == 1 else [None, obj]

    monkeypatch.setattr(dist_utils, "gather_objects", gather)
    cfg = parse_config(["--synthetic", "--output-dir", str(tmp_path)])
    loaded, plan = resume.resume_state(cfg, dist_utils.DistEnv(rank=1, world_size=2))
    assert loaded["step"] == 2
    assert plan == chosen
    assert calls[0] is None  # rank 1 offered no choice of its own


def test_a_rank_that_cannot_read_rank_0_s_choice_stops_every_rank(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = {"path": str(tmp_path / "gone.pt"), "skipped": [], "error": None}
    theirs = iter([[chosen, None], [None, "rank 1 cannot read the checkpoint rank 0 chose: x"]])
    monkeypatch.setattr(dist_utils, "gather_objects", lambda env, obj: next(theirs))
    torch.save(state(2), tmp_path / "gone.pt")
    cfg = parse_config(["--synthetic", "--output-dir", str(tmp_path)])
    with pytest.raises(BadInputError, match=r"^rank 1 cannot read the checkpoint rank 0 chose: x$"):
        resume.resume_state(cfg, dist_utils.DistEnv(rank=0, world_size=2))


def test_a_failure_to_join_the_group_is_recorded_as_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The group is joined before the data scan now (rank 0 chooses the checkpoint): a
    failure there is still a failed run with its summary, not a bare traceback."""

    def no_peer(env: dist_utils.DistEnv, timeout: float) -> None:
        raise RuntimeError("the rendezvous timed out")

    monkeypatch.setattr(dist_utils, "init_distributed", no_peer)
    assert main([*SYNTH, "--max-steps", "1", "--output-dir", str(tmp_path)]) == 1
    s = read_json(tmp_path / "summary.json")
    assert (s["status"], s["error"]) == ("failed", "RuntimeError: the rendezvous timed out")


@pytest.mark.parametrize(
    ("restart", "given", "used"),
    [("", "archive", "archive"), ("0", "never", "never"), ("1", "archive", "auto"),
     ("2", "never", "auto"), ("1", "auto", "auto")],
)  # fmt: skip
def test_a_run_its_agents_restarted_goes_on_from_its_newest_checkpoint(
    monkeypatch: pytest.MonkeyPatch, restart: str, given: str, used: str
) -> None:
    monkeypatch.setenv(resume.RESTART_ENV, restart)
    assert resume.restarted(parse_config(["--synthetic", "--resume", given])).resume == used
