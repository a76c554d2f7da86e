"""Which GPUs a host gives a run, and which the image's CUDA cannot use.

Standard library only: train.yml's preflight module (roles/trainer_run/library) imports this
file through its module_utils link, on hosts without the trainer, and ddpfleet_doctor.gpucheck
uses it inside the image, so both apply the same compute-capability floor.
"""

from __future__ import annotations


def capability(text: str) -> tuple[int, int]:
    """ "X.Y" -> (X, Y); anything else -> (0, 0), below every floor."""
    try:
        major, minor = (int(x) for x in text.split("."))
    except ValueError:
        return (0, 0)
    return major, minor


def capability_problems(found: list[tuple[str, str]], minimum: str) -> list[str]:
    """'GPU i (model) has compute capability x.y, below 7.5' for each GPU the image's CUDA
    cannot run; ``found``: [(model, "X.Y")]."""
    return [
        f"GPU {i} ({name}) has compute capability {cap}, below {minimum}"
        for i, (name, cap) in enumerate(found)
        if capability(cap) < capability(minimum)
    ]


def parse_smi(out: str) -> list[tuple[str, str]]:
    """nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader -> [(name, "X.Y")]."""
    rows = [ln.rsplit(",", 1) for ln in out.splitlines() if "," in ln]
    return [(name.strip(), cap.strip()) for name, cap in rows]


def plan(
    found: list[tuple[str, str]], wanted: int, nproc: int, minimum: str
) -> tuple[list[str], int]:
    """(problems, GPUs to use). ``wanted`` -1: every GPU found (the inventory has no gpus);
    more ranks than GPUs would share a GPU (NCCL fails with "Duplicate GPU"); a GPU below
    ``minimum`` cannot run the image's CUDA."""
    gpus = len(found) if wanted < 0 else wanted
    problems = []
    if gpus > len(found):
        problems.append(f"{len(found)} GPUs visible, inventory says gpus={gpus}")
    if gpus > 0 and nproc > gpus:
        problems.append(f"train_nproc_per_node={nproc} is more than the {gpus} GPUs to use")
    return problems + capability_problems(found[:gpus], minimum), gpus
