"""Data safety of a run on the sandbox (issue 11, points 6 and 7).

A run whose learning rate makes it diverge fails, names the step and keeps only finite
checkpoints, and a re-run with a sane learning rate resumes from the last good one.
Links planted in its run directory make train.yml refuse it, naming them.
``train_resume=never`` on that used run is refused by train.yml without touching it;
restarted with ``train_resume=archive`` it moves the old checkpoints aside and starts at step 0.
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from site_fixtures import PlaybookRun, run_site
from train_fixtures import FAST, SHARED, run_id

DIVERGE = ["-e", "train_lr=1e30", "-e", "train_warmup_epochs=0", "-e", "train_max_steps=40"]
DIVERGE += ["-e", "train_checkpoint_every=1", "-e", "train_keep_checkpoints=40"]


def train(sandbox: Any, rid: str, *args: str) -> PlaybookRun:
    return run_site(sandbox, "-e", f"run_id={rid}", *FAST, *args, playbook="train.yml")


def run_file(sandbox: Any, rid: str, name: str) -> str:
    proc = sandbox.ssh(sandbox.nodes[0], f"cat {SHARED}/runs/{rid}/{name}")
    assert proc.returncode == 0, f"{name}: {proc.stderr}"
    return proc.stdout


def checkpoint_files(sandbox: Any, rid: str, where: str = "checkpoints") -> dict[str, str]:
    """{name: size and mtime} of the run's checkpoint files."""
    proc = sandbox.ssh(
        sandbox.nodes[0], f"cd {SHARED}/runs/{rid}/{where} && stat -c '%n %s %Y' step-*.pt"
    )
    assert proc.returncode == 0, proc.stderr
    return {line.split()[0]: line for line in proc.stdout.splitlines()}


def steps_of(names: dict[str, str]) -> list[int]:
    return sorted(int(re.match(r"step-(\d+)\.pt", n).group(1)) for n in names)


@pytest.fixture(scope="module")
def diverged(cluster: Any) -> tuple[str, PlaybookRun, dict]:
    rid = run_id("nan")
    run = train(cluster, rid, *DIVERGE)
    return rid, run, json.loads(run_file(cluster, rid, "summary.json"))


def test_diverged_run_fails_and_names_the_step(cluster: Any, diverged) -> None:
    rid, run, s = diverged
    assert run.rc != 0, run.tail()
    assert s["status"] == "failed", s
    assert re.fullmatch(r"(loss|parameters) became non-finite (at|by) step \d+.*", s["error"])
    assert s["nonfinite_step"] < 40
    assert rid in s["cause"]


def test_diverged_run_kept_only_checkpoints_before_the_step(cluster: Any, diverged) -> None:
    rid, _, s = diverged
    steps = steps_of(checkpoint_files(cluster, rid))
    assert steps, "the first steps were finite and checkpointed"
    assert max(steps) <= s["nonfinite_step"]
    assert s["last_checkpoint"] == f"checkpoints/step-{max(steps):09d}.pt"
    log = run_file(cluster, rid, "logs/rank-0.log")
    assert f"training failed: {s['error']}" in log


def test_links_planted_in_the_run_directory_are_refused_before_anything_starts(
    cluster: Any, diverged
) -> None:
    """Links where ddpfleet writes or reads (as a program in the run's container could plant
    them) make train.yml refuse the run, naming them, before any preflight or write."""
    rid, _, _ = diverged
    run_dir = f"{SHARED}/runs/{rid}"
    before = checkpoint_files(cluster, rid)
    plant = f"ln -s /etc/shadow {run_dir}/nodes/planted.exit && ln -s /etc {run_dir}/lib"
    assert cluster.ssh(cluster.nodes[0], plant).returncode == 0
    try:
        run = train(cluster, rid, "-e", "train_lr=0.1")
    finally:
        cluster.ssh(cluster.nodes[0], f"rm -f {run_dir}/nodes/planted.exit {run_dir}/lib")
    assert run.rc != 0
    said = " ".join(run.stdout.split())  # the YAML callback folds long lines
    assert "holds links where ddpfleet writes or reads (nodes/planted.exit, lib)" in said, said[
        -3000:
    ]
    assert "Check every trainer before starting anything" not in run.stdout
    assert checkpoint_files(cluster, rid) == before


def test_resume_never_on_the_used_run_is_refused_and_touches_nothing(
    cluster: Any, diverged
) -> None:
    """Refused by train.yml from the run's state, before its lock, preflight or any container
    (the trainer's own refusal of the same is a unit test: test_trainer_resume)."""
    rid, _, _ = diverged
    before = checkpoint_files(cluster, rid)
    metrics = run_file(cluster, rid, "metrics.jsonl")
    run = train(cluster, rid, "-e", "train_resume=never", "-e", "train_max_steps=4")
    assert run.rc != 0
    said = " ".join(run.stdout.split())  # the YAML callback folds long lines
    newest = f"step-{max(steps_of(before)):09d}.pt"
    assert (
        f"train_resume=never: {SHARED}/runs/{rid}/checkpoints has {len(before)} checkpoint(s) "
        f"(up to {newest}); continue with train_resume=auto"
    ) in said, said[-3000:]
    assert "Take the run's launch lock" not in run.stdout
    assert checkpoint_files(cluster, rid) == before
    assert run_file(cluster, rid, "metrics.jsonl") == metrics


def test_rerun_resumes_from_the_last_good_checkpoint(cluster: Any, diverged) -> None:
    rid, _, s = diverged
    last_good = int(s["last_checkpoint"].removeprefix("checkpoints/step-").removesuffix(".pt"))
    # With lr 1e30 the weights one step before the NaN are finite but far too large for any
    # lr to rescue: what the re-run must do is start from that checkpoint, not from step 0 or
    # from NaN weights (a real run that diverges slowly then goes on with the lower lr).
    train(cluster, rid, "-e", "train_lr=0.1", "-e", f"train_max_steps={last_good + 2}")
    log = run_file(cluster, rid, "logs/rank-0.log")
    assert f"resumed from step {last_good} (" in log, log[-3000:]
    assert max(steps_of(checkpoint_files(cluster, rid))) <= s["nonfinite_step"]


def test_archive_moves_the_used_run_aside_and_starts_over(cluster: Any, diverged) -> None:
    """The diverged (and re-run) run restarted with train_resume=archive: its checkpoints and
    records move to archive/<stamp>/ as they were, and the run starts again at step 0."""
    rid, _, _ = diverged
    old = checkpoint_files(cluster, rid)
    before = json.loads(run_file(cluster, rid, "summary.json"))
    run = train(cluster, rid, "-e", "train_resume=archive", "-e", "train_max_steps=3")
    assert run.rc == 0, run.tail()
    after = json.loads(run_file(cluster, rid, "summary.json"))
    assert (after["status"], after["steps"], after["resumed_from_step"]) == ("completed", 3, None)
    listing = cluster.ssh(cluster.nodes[0], f"ls {SHARED}/runs/{rid}/archive")
    (stamp,) = listing.stdout.split()
    assert checkpoint_files(cluster, rid, f"archive/{stamp}/checkpoints") == old
    assert json.loads(run_file(cluster, rid, f"archive/{stamp}/summary.json")) == before
