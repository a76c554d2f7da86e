"""The stop-on-signal protocol: SIGTERM/SIGINT set a flag, the loop finishes its step.

Nothing here imports torch, so ``python -m trainer`` installs the handler before the
seconds-long torch import: a signal during start-up is not lost either.
"""

from __future__ import annotations

import os
import signal
from types import FrameType


class StopFlag:
    """SIGTERM/SIGINT set ``signum``; a second signal exits at once (checkpoints are atomic).

    ``agreed`` is the signal all ranks agreed to stop for (set by ``settle`` when the
    training loop's collective says some rank was signalled). A rank on another host can stop
    on a peer's signal before its own arrives; that first signal of its own, in the middle of
    the stop checkpoint, must not count as a second one.
    """

    def __init__(self) -> None:
        self.signum = 0
        self.agreed = 0

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)
        signal.signal(signal.SIGINT, self._handle)

    def settle(self, any_rank_signalled: float) -> bool:
        """Record the ranks' collective answer (a sum or max of their ``signum``s).

        Once agreed, stays agreed: ``agreed`` is this rank's own signal, or SIGTERM when
        only a peer was signalled. Returns whether the ranks agreed to stop.
        """
        if any_rank_signalled and not self.agreed:
            self.agreed = self.signum or signal.SIGTERM
        return bool(self.agreed)

    def _handle(self, signum: int, _frame: FrameType | None) -> None:
        if self.signum:
            os._exit(128 + signum)  # nothing is left half-written: saves are temp + rename
        self.signum = signum


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: leave SIGTERM/SIGINT to the rank process.

    torchrun signals each rank's whole process group, and Ctrl-C reaches a terminal's
    foreground group, so loader workers get the stop signal too. A worker that died of it
    would fail the rank ("worker killed by signal") instead of letting it checkpoint and
    stop. Workers still end: the rank shuts them down on exit, and they exit if it dies.
    """
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
