"""A small data-parallel training script that knows nothing of ddpfleet: plain
torch.distributed (gloo, or NCCL on GPUs), a DistributedSampler and DDP, launched by torchrun.

It fits a linear model to noisy synthetic data and writes, per rank, result-<rank>.json into
--out (under ddpfleet: the run directory, $DDPFLEET_RUN_DIR) with the world size, the steps
and a digest of the final weights (equal on every rank: DDP keeps the replicas in step).

Under ddpfleet it also reports live progress through the optional heartbeat helper, which
train.yml puts on the PYTHONPATH (`import ddpfleet_heartbeat`); anywhere else it runs as is:

    torchrun --nproc-per-node=2 train_ddp.py --epochs 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

try:  # optional: live progress and stall detection when run by ddpfleet
    import ddpfleet_heartbeat
except ImportError:
    ddpfleet_heartbeat = None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds to wait after a step")
    p.add_argument("--out", default=os.environ.get("DDPFLEET_RUN_DIR", "."))
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")

    gen = torch.Generator().manual_seed(0)  # the same data set on every rank
    x = torch.randn(1024, 8, generator=gen)
    y = x @ torch.arange(1.0, 9.0).unsqueeze(1) + 0.1 * torch.randn(1024, 1, generator=gen)
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Linear(8, 1).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.02)
    total = args.epochs * len(loader)
    beat = ddpfleet_heartbeat.start(total_steps=total) if ddpfleet_heartbeat else None

    step, loss = 0, torch.zeros(())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if beat:
                beat.step(step, loss=loss.item(), epoch=epoch)
            time.sleep(args.step_sleep)
        if rank == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f} ({step}/{total} steps)", flush=True)

    weights = b"".join(t.detach().cpu().numpy().tobytes() for t in model.parameters())
    result = {"rank": rank, "world_size": world, "steps": step, "loss": loss.item(),
              "digest": hashlib.sha256(weights).hexdigest()}  # fmt: skip
    with open(os.path.join(args.out, f"result-{rank}.json"), "w", encoding="utf-8") as fh:
        json.dump(result, fh)
    if beat:
        beat.stop()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
