"""The doctor's network check: one torchrun job over every host.

(a) An all-reduce of ``--allreduce-mb`` MB, timed ``--iters`` times, reported as bus bandwidth
the way nccl-tests define it (busbw = bytes * 2 * (n - 1) / n / time). (b) Host-to-host TCP
throughput for every pair of hosts over raw sockets, on the hosts' cluster addresses: pairs
in round-robin rounds (disjoint pairs at the same time), the lower-numbered host sends for
``--pair-seconds``, the other measures what arrives. Rank 0 prints one JSON line::

    torchrun --nnodes 3 --nproc-per-node 1 --node-rank R --rdzv-backend static \\
        --master-addr 10.0.0.11 --master-port 29600 -m ddpfleet_doctor network \\
        --names node1,node2,node3 --addresses 10.0.0.11,10.0.0.12,10.0.0.13

Ranks are grouped by host in rank order (torchrun's static rendezvous: rank = node_rank *
nproc + local_rank); the first rank of each host runs that host's side of the pair tests.
"""

from __future__ import annotations

import datetime
import os
import socket
import time

CHUNK = 1 << 20


def round_robin(n: int) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs (i < j) covering every pair of ``n`` hosts exactly once (the
    circle method: n - 1 rounds for even n, n rounds for odd n)."""
    ids: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(ids)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for k in range(m // 2):
            a, b = ids[k], ids[m - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        ids = [ids[0], ids[-1], *ids[1:-1]]
    return [r for r in rounds if r]


def busbw_gbps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' all-reduce bus bandwidth in GB/s (1e9 bytes): algbw * 2 * (n - 1) / n."""
    return nbytes / seconds / 1e9 * 2 * (ranks - 1) / ranks


def _send(address: str, port: int, seconds: float) -> None:
    payload = memoryview(bytearray(CHUNK))
    with socket.create_connection((address, port), timeout=seconds + 30) as conn:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            conn.sendall(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the receiver's acknowledgement: everything arrived


def _receive(listener: socket.socket, seconds: float) -> tuple[int, float]:
    listener.settimeout(seconds + 30)
    conn, _ = listener.accept()
    with conn:
        conn.settimeout(seconds + 30)
        buf = bytearray(CHUNK)
        got = conn.recv_into(buf)
        start, total = time.monotonic(), 0  # from the first byte: not the connection set-up
        while got:
            total += got
            got = conn.recv_into(buf)
        elapsed = time.monotonic() - start
        conn.sendall(b"k")
    return total, elapsed


def _allreduce(dist, tensor, iters: int, control, sync) -> float:
    """Mean seconds of ``iters`` all-reduces of ``tensor``, after 2 untimed ones."""
    timings = []
    for i in range(2 + iters):
        sync()
        dist.barrier(group=control)
        start = time.perf_counter()
        dist.all_reduce(tensor)
        sync()
        if i >= 2:
            timings.append(time.perf_counter() - start)
    return sum(timings) / len(timings)


def _pairs(dist, names: list, addresses: list, per_host: int, seconds: float, *, control) -> list:
    """This rank's share of the pair tests (the receiving host records each pair)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    host, agent = rank // per_host, rank % per_host == 0
    listener = socket.create_server((addresses[host], 0)) if agent else None
    ports: list = [None] * world
    dist.all_gather_object(ports, listener.getsockname()[1] if listener else None, group=control)
    measured = []
    try:
        for pairs in round_robin(len(names)):
            dist.barrier(group=control)
            for a, b in pairs if agent else []:
                if host == a:
                    _send(addresses[b], ports[b * per_host], seconds)
                elif host == b:
                    total, elapsed = _receive(listener, seconds)
                    rate = total * 8 / max(elapsed, 1e-6) / 1e9
                    measured.append(
                        {
                            "a": names[a],
                            "b": names[b],
                            "gbits_per_sec": round(rate, 3),
                            "mb": round(total / 1e6, 1),
                            "seconds": round(elapsed, 3),
                        }
                    )
    finally:
        if listener:
            listener.close()
    return measured


def run(args) -> dict | None:
    """This rank's part; rank 0 returns the result (others None)."""
    import torch  # noqa: PLC0415 - round_robin and busbw_gbps import without torch
    import torch.distributed as dist  # noqa: PLC0415

    names, addresses = args.names.split(","), args.addresses.split(",")
    if len(names) != len(addresses):
        raise ValueError("--names and --addresses need one entry per host")
    world = int(os.environ["WORLD_SIZE"])
    if world % len(names):
        raise ValueError(f"{world} ranks do not split evenly over {len(names)} hosts")
    cuda = torch.cuda.is_available() and args.backend != "gloo"
    backend = args.backend or ("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else None
    if cuda:
        torch.cuda.set_device(device)
    timeout = datetime.timedelta(seconds=args.timeout)
    dist.init_process_group(
        backend, timeout=timeout, **({"device_id": device} if backend == "nccl" else {})
    )
    try:
        control = dist.new_group(backend="gloo", timeout=timeout) if backend != "gloo" else None
        tensor = torch.ones(int(args.allreduce_mb * (1 << 20)) // 4, device=device or "cpu")
        sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
        per_op = _allreduce(dist, tensor, args.iters, control, sync)
        nbytes = tensor.numel() * tensor.element_size()
        per_host = world // len(names)
        measured = _pairs(dist, names, addresses, per_host, args.pair_seconds, control=control)
        gathered: list = [None] * world
        dist.all_gather_object(gathered, measured, group=control)
        rank = dist.get_rank()
    finally:
        dist.destroy_process_group()
    if rank != 0:
        return None
    order = {name: i for i, name in enumerate(names)}
    pairs = sorted(
        (p for part in gathered for p in part), key=lambda p: (order[p["a"]], order[p["b"]])
    )
    return {
        "allreduce": {
            "backend": backend,
            "size_mb": args.allreduce_mb,
            "ranks": world,
            "iters": args.iters,
            "seconds": round(per_op, 6),
            "algbw_gbps": round(nbytes / per_op / 1e9, 3),
            "busbw_gbps": round(busbw_gbps(nbytes, per_op, world), 3),
        },
        "pairs": pairs,
    }
