"""Prove that a host's GPUs can train: CUDA initialises on each, every GPU's compute capability
is supported, and a real NCCL all-reduce across all of them returns the right sum.

train.yml's preflight runs it in the training image, with the run's GPUs::

    python -m ddpfleet_doctor.gpucheck --host node1 --gpus 8 --min-capability 7.5

One line on stdout and exit 0 when all is well; else one line naming the host and the CUDA or
NCCL error, exit 1:

- CUDA that cannot start gives CUDA's own error, with the usual cause where one is known
  (error 802 on an NVSwitch board: the fabric manager is not running);
- a rank that dies without a word (a signal, NCCL's watchdog aborting) is named with it;
- an all-reduce that does not finish within ``--timeout`` seconds (a hang: P2P through a
  PCIe switch with ACS on, NVLink or fabric trouble) is ended and reported as a hang.

``--device cpu --backend gloo`` runs the same all-reduce between CPU processes (for tests on
machines without GPUs).
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddpfleet_doctor import gpuplan

ELEMENTS = 1 << 20  # 4 MiB of float32 per rank: big enough for NCCL's ring/tree, not for memory
TIMEOUT = 120.0  # seconds for CUDA and NCCL start-up plus one all-reduce on every GPU

# The usual cause behind CUDA errors that stop it from starting at all (the CUDA runtime's
# error numbers, as torch's message quotes them).
CUDA_HINTS = {
    "Error 802": "on an NVSwitch board (HGX/DGX) nvidia-fabricmanager is not running, or its "
    "version differs from the driver's",
    "Error 803": "the NVIDIA libraries in the container do not match the host's kernel driver",
    "Error 804": "the image's CUDA forward-compatibility libraries do not support this GPU: "
    "upgrade the host's driver",
    "no NVIDIA driver": "the container got no GPU (NVIDIA runtime or device request missing) "
    "or the host's driver is not loaded",
}
HANG_HINT = (
    "a hang: P2P through a PCIe switch with ACS on, or NVLink/fabric trouble "
    "(NCCL_P2P_DISABLE=1 in train_env tells them apart)"
)


def cuda_start_problem(error: BaseException) -> str:
    """One line from the exception CUDA's start-up raised: its 'Error NNN: ...' part (torch
    wraps it in advice about calling CUDA functions too early), and the usual cause."""
    text = " ".join(str(error).split())
    at = text.find("Error ")
    core = text[at:] if at >= 0 else text.split(". ")[0]
    hint = next((h for key, h in CUDA_HINTS.items() if key in text), "")
    return f"CUDA cannot start: {core}" + (f" ({hint})" if hint else "")


def _cuda_start_error() -> str:
    try:
        torch.cuda.init()
    except Exception as exc:  # RuntimeError from the CUDA runtime, AssertionError without CUDA
        return cuda_start_problem(exc)
    return "CUDA is not available (driver, container toolkit, or no GPU given)"


def sum_problem(values: torch.Tensor, world: int) -> str | None:
    """The all-reduce of (rank + 1) over ``world`` ranks must be world * (world + 1) / 2."""
    want = world * (world + 1) / 2
    if bool((values == want).all()):
        return None
    return f"all-reduce returned {values.min().item()}..{values.max().item()}, expected {want}"


def _cap(device: int) -> str:
    return "{}.{}".format(*torch.cuda.get_device_capability(device))


def _rank(rank: int, job: tuple[int, str, str, str, float], out: dict) -> None:
    world, init, backend, device_type, timeout = job
    try:
        device = torch.device(device_type, rank) if device_type == "cuda" else torch.device("cpu")
        if device_type == "cuda":
            torch.cuda.set_device(device)
        kwargs = {"device_id": device} if backend == "nccl" else {}
        dist.init_process_group(
            backend,
            init_method=init,
            rank=rank,
            world_size=world,
            # longer than the parent's deadline: a hang is reported as one, not as
            # NCCL's watchdog aborting the process
            timeout=datetime.timedelta(seconds=timeout + 60),
            **kwargs,
        )
        t = torch.full((ELEMENTS,), float(rank + 1), device=device)
        dist.all_reduce(t)
        if device_type == "cuda":
            torch.cuda.synchronize(device)
        out[rank] = sum_problem(t, world)
        dist.destroy_process_group()
    except Exception as exc:  # anything CUDA/NCCL raises: reported as this rank's line
        last = traceback.format_exception_only(type(exc), exc)[-1].strip()
        out[rank] = f"{device_type}:{rank}: {last.splitlines()[0]}"


def check(
    gpus: int, backend: str, device_type: str, minimum: str, timeout: float = TIMEOUT
) -> list[str]:
    """Problems found (empty: the GPUs and the all-reduce work)."""
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return [_cuda_start_error()]
        found = torch.cuda.device_count()
        if found < gpus:
            return [f"{found} GPUs visible in the container, {gpus} wanted"]
        models = [(torch.cuda.get_device_name(i), _cap(i)) for i in range(gpus)]
        problems = gpuplan.capability_problems(models, minimum)
        if problems:
            return problems
    with tempfile.TemporaryDirectory() as tmp, mp.Manager() as manager:
        out = manager.dict()
        init = "file://" + os.path.join(tmp, "rendezvous")
        job = (gpus, init, backend, device_type, timeout)
        ranks = mp.start_processes(_rank, args=(job, out), nprocs=gpus, join=False)
        died = wait_ranks(ranks, timeout)
        if died:
            rank, how = died
            return [out.get(rank) or f"{device_type}:{rank}: the rank died ({how})"]
        if any(p.is_alive() for p in ranks.processes):
            silent = ", ".join(str(r) for r in range(gpus) if r not in out)
            stop_ranks(ranks)
            return [f"{device_type}:{silent} did not finish within {timeout:g} s, {HANG_HINT}"]
        return [out.get(r, f"rank {r} reported nothing") for r in range(gpus) if out.get(r, "?")]


def wait_ranks(ranks: mp.ProcessContext, timeout: float) -> tuple[int, str] | None:
    """Wait until every rank has exited or ``timeout`` has passed. A rank that exits with an
    error (killed by a signal, aborted) ends the others at once: (its rank, how it ended)."""
    deadline = time.monotonic() + timeout
    try:
        while not ranks.join(timeout=max(0.0, deadline - time.monotonic()), grace_period=1):
            if time.monotonic() >= deadline:
                return None
    except mp.ProcessExitedException as exc:
        how = f"signal {exc.signal_name}" if exc.signal_name else f"exit code {exc.exit_code}"
        return exc.error_index, how
    return None


def stop_ranks(ranks: mp.ProcessContext) -> None:
    """SIGKILL ranks still running (hung in CUDA or NCCL: SIGTERM may never be handled)."""
    for process in ranks.processes:
        if process.is_alive():
            process.kill()
        process.join()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="ddpfleet_doctor.gpucheck", description=__doc__.splitlines()[0]
    )
    p.add_argument("--host", default=os.uname().nodename, help="named in the result line")
    p.add_argument("--gpus", type=int, required=True, help="GPUs (ranks) to check, from 0")
    p.add_argument("--min-capability", default="7.5", help="lowest compute capability allowed")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--backend", choices=["nccl", "gloo"], default="nccl")
    p.add_argument(
        "--timeout", type=float, default=TIMEOUT, help="seconds before a hang is reported"
    )
    a = p.parse_args(argv)
    if a.gpus < 1 or gpuplan.capability(a.min_capability) == (0, 0) or not 0 < a.timeout < 1e6:
        sys.stderr.write(
            f"{p.prog}: error: need --gpus >= 1, --min-capability X.Y and --timeout > 0\n"
        )
        return 2
    problems = check(a.gpus, a.backend, a.device, a.min_capability, a.timeout)  # type: ignore[arg-type]
    if problems:
        sys.stdout.write(f"gpucheck failed on {a.host}: {'; '.join(problems)}\n")
        return 1
    what = f"{a.backend} all-reduce across {a.gpus} {'GPUs' if a.device == 'cuda' else 'ranks'}"
    sys.stdout.write(f"gpucheck ok on {a.host}: {what}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
