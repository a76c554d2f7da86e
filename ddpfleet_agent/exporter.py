"""The agent's Prometheus endpoint (``--metrics ADDR:PORT``, served in a daemon thread): this
host's ranks as the agent last read their heartbeats, a tick old at most (a rank that stops
beating shows a growing heartbeat age, a host that is gone a target that is down: never a stale
value), its GPUs through NVML where there are any, and the run's identity as one info metric.

It answers only a scrape of its own run (``?run_id=<id>``, announce.yml): a target an earlier
run on this host and port left behind, which Prometheus scrapes for ~10 s more (its reloads are
throttled), gets 404 instead of this run's metrics under its id.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer

from ddpfleet_agent.ranks import number
from ddpfleet_agent.store import server_class

if TYPE_CHECKING:
    from ddpfleet_agent.cli import AgentConfig

PHASES = ("start", "scan", "train", "validate", "checkpoint", "done")
# restarts, the ranks' start, their heartbeats, this host's speed ratio (None: not known)
Reading = Callable[[], tuple[int, float, dict[int, dict], float | None]]


# name (after ddpfleet_): help, labels
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "rank_step": ("Optimizer steps the rank has finished.", ("rank",)),
    "rank_total_steps": ("Optimizer steps the run will take.", ("rank",)),
    "rank_heartbeat_age_seconds": ("Seconds since the rank's heartbeat thread wrote.", ("rank",)),
    "rank_progress_age_seconds": ("Seconds since the rank last made progress.", ("rank",)),
    "rank_phase": ("1 for the phase the rank is in, 0 for the others.", ("rank", "phase")),
    "host_images_per_second": ("Training images/s of this host's ranks (last log interval).", ()),
    "host_speed_ratio": (
        "This host's own time per image over the median host's, inverted "
        "(0.31: a third as fast; train_rebalance).",
        (),
    ),
    "run_loss": ("The run's mean training loss over the last log interval.", ()),
    "run_images_per_second": ("Training images/s of all ranks (last log interval).", ()),
    "run_attempt_start_time_seconds": ("When this attempt's ranks started (Unix time).", ()),
    "gpu_utilization_ratio": ("Share of the last sample period a kernel ran on the GPU.", ("gpu",)),
    "gpu_memory_used_bytes": ("GPU memory in use.", ("gpu",)),
    "gpu_memory_total_bytes": ("GPU memory in all.", ("gpu",)),
    "gpu_temperature_celsius": ("GPU core temperature.", ("gpu",)),
}


def _gauge(name: str, value: float | None = None) -> GaugeMetricFamily:
    """The family of GAUGES' ``name``; with ``value``, its one unlabelled sample."""
    doc, labels = GAUGES[name]
    labels = list(labels) if value is None else None  # the library takes one or the other
    return GaugeMetricFamily(f"ddpfleet_{name}", doc, value, labels)


def rank_metrics(beats: dict[int, dict], now: float) -> Iterator[Metric]:
    """Per rank: step, heartbeat and progress ages, phase; per host: the ranks' own img/s
    summed; per run: the last interval's loss and total img/s (the ranks agree on them)."""
    step, total, live, moved, phase = (_gauge(name) for name in GAUGES if name.startswith("rank_"))
    for rank, beat in sorted(beats.items()):
        label = [str(rank)]
        step.add_metric(label, number(beat.get("step")) or 0.0)
        total.add_metric(label, number(beat.get("total_steps")) or 0.0)
        for family, key in ((live, "time"), (moved, "progress_time")):
            stamp = number(beat.get(key))
            if stamp is not None:
                family.add_metric(label, max(now - stamp, 0.0))
        current = str(beat.get("phase") or "start")
        for name in (*PHASES, *(() if current in PHASES else (current,))):
            phase.add_metric([*label, name], float(name == current))
    yield from (step, total, live, moved, phase)
    own = [number(b.get("rank_images_per_sec")) for b in beats.values()]
    if own and None not in own:
        yield _gauge("host_images_per_second", sum(own))  # type: ignore[arg-type]
    for key, name in (("loss", "run_loss"), ("images_per_sec", "run_images_per_second")):
        known = [v for _, b in sorted(beats.items()) if (v := number(b.get(key))) is not None]
        if known:
            yield _gauge(name, known[0])


class Gpus:
    """This host's GPUs through NVML (nvidia-ml-py); nothing where NVML does not load."""

    def __init__(self) -> None:
        self.nvml: Any = None
        with contextlib.suppress(Exception):  # no library, no driver, no device: no GPU metrics
            import pynvml  # noqa: PLC0415 - only where an agent serves metrics

            pynvml.nvmlInit()
            self.nvml = pynvml

    def collect(self) -> Iterator[Metric]:
        if (nvml := self.nvml) is None:
            return
        families = [_gauge(name) for name in GAUGES if name.startswith("gpu_")]
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            busy = nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            celsius = nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU)
            values = (busy, memory.used, memory.total, celsius)  # GAUGES' order
            for family, value in zip(families, values, strict=True):
                family.add_metric([str(index)], float(value))
        yield from families


class RunCollector:
    """What one scrape of an agent returns (prometheus_client's custom collector)."""

    def __init__(self, cfg: AgentConfig, read: Reading, gpus: Gpus | None = None):
        self.cfg, self.read, self.gpus = cfg, read, gpus or Gpus()

    def collect(self) -> Iterator[Metric]:
        cfg = self.cfg
        count, started, beats, speed = self.read()
        ids = {"run_id": cfg.run_id, "host": cfg.host, "attempt": cfg.attempt}
        ids["node_rank"] = str(cfg.node_rank)
        yield InfoMetricFamily("ddpfleet_run", "The run this agent supervises.", ids)
        doc = "Restarts in place of the run so far (train_restarts)."
        yield CounterMetricFamily("ddpfleet_run_restarts", doc, float(count))
        if started:
            yield _gauge("run_attempt_start_time_seconds", started)
        yield from rank_metrics(dict(beats), time.time())
        if speed is not None:
            yield _gauge("host_speed_ratio", speed)
        yield from self.gpus.collect()


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: object) -> None:  # no access log in the run's output
        pass


def serve(cfg: AgentConfig, read: Reading) -> str:
    """Start the endpoint, each scrape reading the agent as ``read()`` finds it; '' when serving,
    else why not (one line: the run goes on without it)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunCollector(cfg, read))
    metrics = make_wsgi_app(registry)

    def app(environ: dict, start_response: Callable) -> Iterable[bytes]:
        """A scrape that names no run or this one; 404 for another run's."""
        asked = parse_qs(environ.get("QUERY_STRING", "")).get("run_id", [cfg.run_id])[0]
        if asked != cfg.run_id:
            start_response("404 Not Found", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"this endpoint serves run {cfg.run_id}, not {asked}\n".encode()]
        return metrics(environ, start_response)

    try:  # an IPv4 or IPv6 cluster address, as prometheus_client's own server picks it
        server = server_class(ThreadingWSGIServer, cfg.metrics_host, cfg.metrics_port)
        httpd = make_server(cfg.metrics_host, cfg.metrics_port, app, server, handler_class=_Quiet)
    except OSError as exc:
        return f"metrics endpoint {cfg.metrics_host}:{cfg.metrics_port} not started ({exc})"
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return ""
