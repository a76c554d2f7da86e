"""ddpfleet_agent/slurm.py: the sbatch command of a run queued through Slurm, and what
squeue's output says of it (the trainer_run role's ddpfleet_sbatch filter renders the same)."""

from __future__ import annotations

import shlex

import pytest

from ddpfleet_agent import slurm

SPEC = "/var/lib/ddpfleet/launch/r1.json"


def sbatch(time_limit: int = 0) -> list[str]:
    return slurm.sbatch_argv("r1", ["node1", "node2", "node3"], "ddpfleet", time_limit,
                             spec_file=SPEC, output_dir="/var/lib/ddpfleet/runs/r1")  # fmt: skip


def test_the_job_holds_every_host_whole_with_one_task_on_each() -> None:
    argv = sbatch()
    options = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
    assert argv[0] == "sbatch"
    assert {"--parsable", "--exclusive"} <= set(argv)
    assert (options["nodes"], options["nodelist"]) == ("3", "node1,node2,node3")
    assert options["ntasks-per-node"] == "1"
    assert options["job-name"] == "ddpfleet-r1"
    assert options["partition"] == "ddpfleet"
    assert options["output"] == "/var/lib/ddpfleet/runs/r1/slurm-%j.out"
    assert "time" not in options  # 0: the partition's limit


def test_the_step_starts_the_task_program_on_every_node() -> None:
    argv = sbatch()
    assert argv[-2] == "--wrap"
    words = shlex.split(argv[-1])
    assert words[:2] == ["exec", "srun"]
    assert {"--ntasks-per-node=1", "--kill-on-bad-exit=0"} <= set(words)
    assert words[-2:] == [slurm.TASK, SPEC]


@pytest.mark.parametrize(("minutes", "option"), [(90, "--time=90"), ("15", "--time=15")])
def test_time_limit_is_the_job_s_in_minutes(minutes, option) -> None:
    assert option in sbatch(minutes)


@pytest.mark.parametrize(("out", "job"), [("42\n", "42"), ("17;ddpfleet\n", "17")])
def test_job_id_of_sbatch_parsable(out: str, job: str) -> None:
    assert slurm.job_id(out) == job


def test_no_job_id_is_an_error() -> None:
    with pytest.raises(ValueError, match="sbatch printed no job id"):
        slurm.job_id("sbatch: error: Batch job submission failed\n")


def test_queue_position_counts_the_pending_jobs_ahead() -> None:
    pending = "40\n44\n42\n"
    assert [slurm.queue_position(pending, j) for j in ("40", "44", "42", "7")] == [1, 2, 3, 0]


@pytest.mark.parametrize(
    ("out", "view"),
    [
        ("PENDING\n40\n42\n", {"job_state": "PENDING", "queue_position": 2}),
        ("RUNNING\n40\n", {"job_state": "RUNNING", "queue_position": 0}),
        ("COMPLETING\n", {}),  # ending: its run's records tell how it went
        ("\n40\n", {}),  # gone from squeue
        ("", {}),
    ],
)
def test_a_job_waiting_for_or_starting_on_its_hosts_is_queued(out: str, view: dict) -> None:
    assert slurm.queued(out, "42") == view


@pytest.mark.parametrize(
    ("out", "line"),
    [
        ("RUNNING\n40\n", "Slurm job 42: RUNNING"),
        ("CANCELLED\n", "Slurm job 42: CANCELLED"),
        ("TIMEOUT\n40\n", "Slurm job 42: TIMEOUT"),
        ("\n40\n", "Slurm job 42: ended (slurmctld lists it no longer)"),
        ("", "Slurm job 42: ended (slurmctld lists it no longer)"),
    ],
)
def test_status_shows_the_job_s_state_or_that_it_ended(out: str, line: str) -> None:
    assert slurm.job_line(out, "42") == line
