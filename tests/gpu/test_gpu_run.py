"""A run as train.yml starts it on one GPU host, without the container: the run agent
supervising torchrun and the trainer on CUDA (NCCL), its Prometheus endpoint scraped while the
run trains (the GPU's NVML metrics among them), and what the run leaves behind: summary.json,
report.txt/png drawn by the agent, TensorBoard curves.

``make test-gpu`` (bench/README.md says what it has shown on which GPU)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

ROOT = Path(__file__).resolve().parents[2]
STEPS = 240
HOST = socket.gethostname()  # the trainer names its host so in TensorBoard


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, list[tuple[dict[str, str], float]]]:
    """{sample name: [(labels, value), ...]} of one scrape; {} while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as reply:
            text = reply.read().decode()
    except OSError:
        return {}
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def test_a_supervised_nccl_run_serves_its_gpu_and_leaves_its_records(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    key = tmp_path / "agent.key"
    key.write_text(os.urandom(32).hex() + "\n")
    key.chmod(0o600)
    metrics = free_port()
    agent = [sys.executable, "-m", "ddpfleet_agent", f"--run-dir={run_dir}", "--run-id=gpu1",
             f"--host={HOST}", "--node-rank=0", f"--hosts={HOST}",
             f"--store=127.0.0.1:{free_port()}", f"--key-file={key}", "--attempt=a1",
             f"--metrics=127.0.0.1:{metrics}"]  # fmt: skip
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
                "--node-rank=0", "--rdzv-backend=static", "--master-addr=127.0.0.1",
                f"--master-port={free_port()}", "--max-restarts=0"]  # fmt: skip
    trainer = ["-m", "trainer", "--synthetic", f"--synthetic-size={STEPS * 128}",
               "--batch-size=128", "--image-size=224", "--workers=2", "--log-every=10",
               f"--output-dir={run_dir}"]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1",
           "DDPFLEET_RUN_DIR": str(run_dir), "DDPFLEET_RUN_ID": "gpu1", "DDPFLEET_ATTEMPT": "a1",
           "DDPFLEET_TENSORBOARD_DIR": str(run_dir / "tensorboard")}  # fmt: skip
    log = tmp_path / "agent.log"
    seen: dict[str, float] = {}
    with log.open("w") as out:
        proc = subprocess.Popen([*agent, "--", *torchrun, *trainer], env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
        deadline = time.monotonic() + 300
        while proc.poll() is None and time.monotonic() < deadline:
            for name, samples in scrape(metrics).items():
                for _, value in samples:
                    seen[name] = max(seen.get(name, 0.0), value)
            time.sleep(0.25)
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert proc.wait() == 0, output[-4000:]
    print(f"largest values scraped: { {k: v for k, v in seen.items() if 'gpu' in k} }")
    # NVML through the agent: the GPU busy, its memory in use, a plausible temperature.
    assert seen.get("ddpfleet_gpu_utilization_ratio", 0) > 0.2, seen
    assert 0 < seen["ddpfleet_gpu_memory_used_bytes"] <= seen["ddpfleet_gpu_memory_total_bytes"]
    assert 15 < seen["ddpfleet_gpu_temperature_celsius"] < 110
    assert seen.get("ddpfleet_host_images_per_second", 0) > 100, seen
    assert seen.get("ddpfleet_rank_step", 0) > 0, seen

    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["device"], summary["steps"]) == ("completed", "cuda", STEPS)
    assert summary["amp"] == "bfloat16", summary
    assert "status completed, steps" in (run_dir / "report.txt").read_text()  # by the agent
    assert (run_dir / "report.png").stat().st_size > 1000
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    losses = [e.step for e in events.Scalars("train/loss")]
    assert losses == list(range(10, STEPS + 1, 10)), losses
    assert events.Scalars(f"hosts/{HOST}/batch_share")[-1].value == 1.0
    print(f"img/s {summary['images_per_sec']}, first lines of report.txt:")
    print("\n".join((run_dir / "report.txt").read_text().splitlines()[:8]))
