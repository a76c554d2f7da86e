"""The compute check's start line: every host's processes warm up on their own, then start
timing at the same moment, so the hosts are compared over the same seconds.

Without it each host timed its steps from the end of its own warm-up, and a host slowed by a
CPU quota started seconds after the others: anything that slowed the machine or the network
for a few seconds (another job, a noisy neighbour's steal time, the image pulls of a host that
was late) fell on some hosts' figures and not on the others'. On the sandbox, whose nodes share
two cores, the host under a 0.3 CPU quota then once measured above 0.8 of the median and was
not flagged (CI, 2026-12-06), where it measures 0.32-0.40 of it otherwise.

Standard library only: the first host's check serves the line (``serve``) on a TCP port; each
measuring process (one per GPU, else one per host) connects once warmed up (``wait``) and is
sent ``go`` when all ``count`` of them are there. Nothing waits for ever: the line opens for
the processes there after ``timeout`` seconds, a process that comes later is let go at once, and
a process that cannot reach the line times on its own; each says so in its figures.
"""

from __future__ import annotations

import socket
import threading
import time

TIMEOUT = 60.0  # seconds a line waits for the last host's warm-up


def parse(spec: str) -> tuple[str, int, int]:
    """``ADDRESS:PORT:COUNT`` (--start-line) as (address, port, count); ValueError naming it."""
    address, _, rest = spec.rpartition(":")
    address, _, port = address.rpartition(":")
    try:
        values = (int(port), int(rest))
    except ValueError:
        values = (0, 0)
    if not address or not 0 < values[0] < 65536 or values[1] < 1:
        raise ValueError(f"--start-line must be ADDRESS:PORT:COUNT (COUNT >= 1), not {spec!r}")
    return address, *values


class Line:
    """The start line, served from a daemon thread of the first host's check (``serve``)."""

    def __init__(self, listener: socket.socket, count: int, timeout: float) -> None:
        self._listener, self._count, self._timeout = listener, count, timeout
        self.opened = threading.Event()
        threading.Thread(target=self._run, name="ddpfleet-start-line", daemon=True).start()

    def _run(self) -> None:
        waiting: list[socket.socket] = []
        deadline = time.monotonic() + self._timeout
        while len(waiting) < self._count and time.monotonic() < deadline:
            self._listener.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                waiting.append(self._listener.accept()[0])
            except TimeoutError:
                break
        self._send(waiting, f"go {len(waiting)} {self._count}\n")
        self.opened.set()
        self._listener.settimeout(None)
        while True:  # whoever comes later goes at once, counted as late
            try:
                conn = self._listener.accept()[0]
            except OSError:
                return
            self._send([conn], "late\n")

    @staticmethod
    def _send(conns: list[socket.socket], line: str) -> None:
        for conn in conns:
            try:
                conn.sendall(line.encode())
            except OSError:
                pass  # that process is gone: the others still go
            finally:
                conn.close()


def serve(port: int, count: int, timeout: float = TIMEOUT) -> Line:
    """Listen on every address at ``port`` and open the line when ``count`` processes wait
    there, or ``timeout`` seconds from now."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("", port))
    listener.listen(max(count, 1))
    return Line(listener, count, timeout)


def wait(address: str, port: int, count: int, timeout: float = TIMEOUT) -> dict:
    """Wait at the line; the figures say how it went: {"together": the processes that started
    timing together (1 when this one timed on its own), "of": count, "waited_sec", and "error"
    when this one did not start with the others}."""
    start = time.monotonic()
    deadline = start + timeout + 5  # the line's own timeout, and its start-up
    said, error = "", None
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((address, port), timeout=2) as conn:
                conn.settimeout(max(0.1, deadline - time.monotonic()))
                said = conn.makefile("r").readline().strip()
            break
        except OSError as exc:  # not served yet, or gone: try again until the deadline
            error = f"{type(exc).__name__}: {exc}"
            time.sleep(0.2)
    waited = round(time.monotonic() - start, 3)
    word, _, rest = said.partition(" ")
    if word != "go":
        why = "came after the others had started" if word == "late" else error or "no answer"
        return {"together": 1, "of": count, "waited_sec": waited, "error": why}
    return {"together": int(rest.split()[0]), "of": count, "waited_sec": waited}
