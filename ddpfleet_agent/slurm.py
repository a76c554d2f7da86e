"""A run as one Slurm job (train.yml -e train_scheduler=slurm), on the controller: the sbatch
command that submits it, and the queue as squeue shows it. Each node of the job runs the slurm
role's task program, which starts the run's container from the parameters kept on that host."""

from __future__ import annotations

import shlex

TASK = "/usr/local/libexec/ddpfleet/ddpfleet-slurm-task"
# squeue's states of a job that waits for its hosts or is starting on them: with nothing of
# its run recorded yet, the run counts as queued (state.yml)
WAITING = ("PENDING", "CONFIGURING", "RUNNING", "REQUEUED", "RESIZING")


def sbatch_argv(
    run_id: str,
    nodes: list[str],
    partition: str,
    time_limit: int,
    *,
    spec_file: str,
    output_dir: str,
) -> list[str]:
    """sbatch for the run: every one of ``nodes`` (Slurm's node names) whole, one task on each,
    the job's output in each host's own record directory of the run (``output_dir``)."""
    argv = [
        "sbatch", "--parsable", f"--job-name=ddpfleet-{run_id}", f"--partition={partition}",
        f"--nodes={len(nodes)}", f"--nodelist={','.join(nodes)}", "--exclusive",
        "--ntasks-per-node=1", f"--output={output_dir}/slurm-%j.out", "--chdir=/",
    ]  # fmt: skip
    if int(time_limit) > 0:
        argv.append(f"--time={int(time_limit)}")  # minutes
    # A task that ends (its host left out of a shrinking run) leaves the others running.
    step = f"exec srun --ntasks-per-node=1 --kill-on-bad-exit=0 {TASK} {shlex.quote(spec_file)}"
    return [*argv, "--wrap", step]


def job_id(sbatch_out: str) -> str:
    """The job id of ``sbatch --parsable``'s output (``42`` or ``42;cluster``)."""
    first = sbatch_out.strip().split(";")[0]
    if not first.isdigit():
        raise ValueError(f"sbatch printed no job id: {sbatch_out.strip()!r}")
    return first


def queue_position(pending: str, job: str) -> int:
    """The job's place among the pending jobs of ``squeue -h -t PENDING --sort=-p,i -o %i``
    (highest priority first): 1 is next; 0 when it is not pending."""
    ids = pending.split()
    return ids.index(str(job)) + 1 if str(job) in ids else 0


def _job_state(squeue_out: str) -> tuple[str, str]:
    """state.yml's one squeue call: (the job's state, "" when squeue lists it no longer; the
    pending jobs by priority, one a line)."""
    state, *pending = squeue_out.splitlines() or [""]
    return state.strip(), "\n".join(pending)


def queued(squeue_out: str, job: str) -> dict:
    """``{job_state, queue_position}`` while the job waits for or starts on its hosts, else {}."""
    state, pending = _job_state(squeue_out)
    if state not in WAITING:
        return {}
    return {"job_state": state, "queue_position": queue_position(pending, job)}


def job_line(squeue_out: str, job: str) -> str:
    """status.yml's line for the run's job: its state (RUNNING; CANCELLED, TIMEOUT or
    COMPLETED while slurmctld still lists an ended job, MinJobAge)."""
    state, _ = _job_state(squeue_out)
    return f"Slurm job {job}: {state or 'ended (slurmctld lists it no longer)'}"
