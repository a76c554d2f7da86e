"""Process-group setup from torchrun's environment, collectives, seeding and teardown."""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import os
import random
import socket

import torch
import torch.distributed as dist


@dataclasses.dataclass
class DistEnv:
    """Where this process sits in the job; ``world_size == 1`` without torchrun."""

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    device: torch.device = dataclasses.field(default_factory=lambda: torch.device("cpu"))
    distributed: bool = False
    host: str = dataclasses.field(default_factory=socket.gethostname)
    control_group: object | None = None  # gloo group for CPU-side agreement (stop flag)
    local_world_size: int = 1  # ranks on this host

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def env_from_torchrun() -> DistEnv:
    """Read RANK/LOCAL_RANK/WORLD_SIZE (set by torchrun); pick the device, init nothing yet."""
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
    else:
        device = torch.device("cpu")
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return DistEnv(
        rank, local_rank, world_size, device, "RANK" in os.environ, local_world_size=local_ranks
    )


def init_distributed(env: DistEnv, timeout_sec: float) -> None:
    """Join the process group: nccl on CUDA, gloo on CPU; plus a gloo group for control."""
    if env.device.type == "cuda":
        torch.cuda.set_device(env.device)
    if not env.distributed:
        return
    backend = "nccl" if env.device.type == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=timeout_sec)
    kwargs = {"device_id": env.device} if backend == "nccl" else {}
    dist.init_process_group(
        backend, rank=env.rank, world_size=env.world_size, timeout=timeout, **kwargs
    )
    env.control_group = (
        dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
    )


def teardown(env: DistEnv) -> None:
    """Destroy the process group if this process made one (safe to call twice)."""
    if env.distributed and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier(group=env.control_group)


def agree_max(env: DistEnv, value: int) -> int:
    """The maximum of ``value`` over all ranks, on the CPU (no GPU synchronisation)."""
    if not env.distributed:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=env.control_group)
    return int(t.item())


def all_reduce_sum(env: DistEnv, values: list[float]) -> list[float]:
    """Sum a few floats over all ranks (used for logged loss and validation accuracy)."""
    t = torch.tensor(values, dtype=torch.float64)
    if env.distributed:
        dist.all_reduce(t, op=dist.ReduceOp.SUM, group=env.control_group)
    return t.tolist()


def gather_objects(env: DistEnv, obj: object) -> list[object]:
    """Every rank's ``obj`` in rank order (on every rank)."""
    if not env.distributed:
        return [obj]
    out: list[object] = [None] * env.world_size
    dist.all_gather_object(out, obj, group=env.control_group)
    return out


def seed_everything(seed: int, rank: int) -> None:
    """Seed Python and torch per rank; the model init is re-synchronised by DDP anyway."""
    random.seed(seed + rank)
    torch.manual_seed(seed + rank)


def rng_state() -> dict[str, object]:
    state: dict[str, object] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, object]) -> None:
    random.setstate(state["python"])  # type: ignore[arg-type]
    torch.set_rng_state(state["torch"])  # type: ignore[arg-type]
    if "cuda" in state and torch.cuda.is_available():
        cuda_states = state["cuda"]
        if len(cuda_states) == torch.cuda.device_count():  # type: ignore[arg-type]
            torch.cuda.set_rng_state_all(cuda_states)  # type: ignore[arg-type]


def sync_buffers(env: DistEnv, module: torch.nn.Module) -> None:
    """Copy rank 0's BatchNorm statistics to every rank (before validation)."""
    if env.distributed:
        for buf in module.buffers():
            dist.broadcast(buf, src=0)


def param_digest(module: torch.nn.Module) -> str:
    """SHA-256 of all parameters' bytes: equal on every rank when DDP kept them in sync."""
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
